"""The key holder's local worker pool: chunks checked and decrypted as they arrive, the same released values as
in-process, refusals before any charge, one charge when a worker dies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from he_partition.core.backend import ChunkedVector, n_chunks
from he_partition.core.errors import PrecisionError
from he_partition.core.measurements import PartitionSums
from parties.common.util import noise_source
from he_partition.he.bfv import BfvBackend, load_context
from he_partition.he.threshold.c1 import c1_of_vector
from parties.decryption.handler import DecryptedMeasurement, DecryptionHandler
from parties.decryption.keys import KeyMaterial, KeyStore
from parties.decryption.ledger import SqliteLedgerStore
from parties.common.config import DecryptionConfig
from parties.decryption.server import KEYS_DIR, create_decryption_server
from parties.decryption.workers import DecryptPool, default_decrypt_workers

from .adversarial_cs import AdversarialComputationServer
from .conftest import Cluster, blocky_histograms

DOMAIN = 5 * 8192 + 100  # six chunks; the measurement reads five
NOISE_KEY = b"k" * 32


M = PartitionSums(DOMAIN, 0.5, 1, starts=tuple(range(0, 4 * 8192, 512)))  # chunk 4 unmeasured


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyStore, KeyMaterial, list[bytes]]:
    """The key store, its key, and one encrypted histogram's measured chunks (the same bytes for every run)."""
    store = KeyStore(tmp_path_factory.mktemp("keys"))
    material = store.load_or_create()
    public = BfvBackend(load_context(material.public_bytes))
    wanted = M.measured_chunks(public.slots)
    assert len(wanted) >= 4 and len(wanted) < n_chunks(DOMAIN, public.slots)
    encrypted = public.encrypt(np.random.default_rng(5).integers(0, 50, DOMAIN)).chunks
    return store, material, [public.serialize_chunk(encrypted[i]) for i in wanted]


def _handler(root: Path, keys: KeyMaterial, pool: DecryptPool | None) -> tuple[DecryptionHandler, str]:
    root.mkdir()
    handler = DecryptionHandler(SqliteLedgerStore(root / "ledger.sqlite"), keys, noise_source(7),
                                noise_key=NOISE_KEY, decrypt_pool=pool)
    contract, _ = handler.open_study(study_id="s1", domain_size=DOMAIN, epsilon=1.0, expected_owners=("a",),
                                     strategy="hier")
    return handler, contract.contract_hash


def _release(root: Path, keys: KeyMaterial, chunks: list[bytes],
             pool: DecryptPool | None, *, stream: bool = False) -> tuple[DecryptedMeasurement, DecryptionHandler]:
    """One measurement through a real handler (real SQLite ledger, real BFV ciphertexts).

    `stream`: as the servicer does with a pool, each chunk handed to the workers as it arrives
    (`decrypt_pipeline`); otherwise checked in-process as they arrive (`checked_chunk`)."""
    handler, contract_hash = _handler(root, keys, pool)
    if stream:
        pipeline = handler.decrypt_pipeline(len(chunks))
        assert pipeline is not None
        for c in chunks:
            pipeline.submit(c)
        out = handler.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=0.5, measurement=M,
                                          chunks=chunks, contract_hash=contract_hash, pipeline=pipeline)
        return out, handler
    checked = [handler.checked_chunk(c, i) for i, c in enumerate(chunks)]
    out = handler.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=0.5, measurement=M,
                                      chunks=chunks, contract_hash=contract_hash, checked=checked)
    return out, handler


def test_pooled_decryption_releases_the_in_process_values(tmp_path: Path, keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """Same noise key, same request: workers loading the key file release byte-identical values."""
    store, material, chunks = keys
    plain, h1 = _release(tmp_path / "a", material, chunks, None)
    pool = DecryptPool(2, secret_path=store.secret_path)
    try:
        pooled, h2 = _release(tmp_path / "b", material, chunks, pool)
        assert pool._executor is not None  # the workers did the decryption
    finally:
        pool.close()
    assert pooled.values.tobytes() == plain.values.tobytes()
    rows = [[(c.kind, c.epsilon, c.detail) for c in h.ledger.charges("s1")] for h in (h1, h2)]
    assert rows[0] == rows[1] and len(rows[0]) == 1


def test_streamed_pipeline_releases_the_in_process_values(tmp_path: Path,
                                                         keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """Chunks handed to the workers as they arrive (parsed, checked and decrypted there once): the same request
    releases byte-identical values and writes the same ledger row as the serial in-process path."""
    store, material, chunks = keys
    plain, h1 = _release(tmp_path / "a", material, chunks, None)
    pool = DecryptPool(2, secret_path=store.secret_path)
    try:
        pool.start()
        pooled, h2 = _release(tmp_path / "b", material, chunks, pool, stream=True)
        again, h3 = _release(tmp_path / "c", material, chunks, pool, stream=True)  # the same workers, still up
    finally:
        pool.close()
    assert pool.restarts == 0
    assert pooled.values.tobytes() == plain.values.tobytes() == again.values.tobytes()
    rows = [[(c.kind, c.epsilon, c.detail) for c in h.ledger.charges("s1")] for h in (h1, h2, h3)]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 1


def test_a_chunk_the_workers_refuse_is_refused_after_the_charge(tmp_path: Path,
                                                                keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """A chunk under another key, streamed to the workers: its integrity check (a function of the secret key) is
    read only after the charge, so the refusal is charged (the ledger row stays, `arrivals` records the epsilon)
    and says only "refused after the charge", not which check or chunk; nothing is released."""
    store, material, chunks = keys
    other = BfvBackend(load_context(KeyStore(tmp_path / "other").load_or_create().public_bytes))
    foreign = other.serialize_chunk(other.encrypt(np.ones(other.slots, dtype=np.int64)).chunks[0])
    bad = [*chunks[:2], foreign, *chunks[3:]]
    pool = DecryptPool(2, secret_path=store.secret_path)
    try:
        handler, contract_hash = _handler(tmp_path / "h", material, pool)
        pipeline = handler.decrypt_pipeline(len(bad))
        assert pipeline is not None
        for c in bad:
            pipeline.submit(c)
        with pytest.raises(PrecisionError, match="^refused after the charge: ") as refused:
            handler.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=0.5, measurement=M,
                                        chunks=bad, contract_hash=contract_hash, pipeline=pipeline)
    finally:
        pool.close()
    assert "chunk" not in str(refused.value) and "noise budget" not in str(refused.value)
    assert [c.epsilon for c in handler.ledger.charges("s1")] == [pytest.approx(0.5)]
    assert [(r.outcome, r.epsilon_charged) for r in handler.arrivals.rows("s1")] == [("refused", pytest.approx(0.5))]


def test_workers_decrypt_with_the_c1_they_are_given(keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """A signed study's substitution in the worker: a chunk with its own c1 decrypts to the in-process values
    (`with_signed_c1` + decrypt); with another chunk's c1 it fails the integrity check."""
    store, material, chunks = keys
    backend = BfvBackend(material.secret_context)
    own = [c1_of_vector(backend.context, c) for c in chunks[:4]]
    expected = [backend.decrypt(ChunkedVector(backend.slots, (backend.deserialize_chunk(
        backend.with_c1(c, own[j], chunk=j)),))) for j, c in enumerate(chunks[:4])]
    pool = DecryptPool(2, secret_path=store.secret_path)
    try:
        pipeline = pool.pipeline()
        for j, c in enumerate(chunks[:4]):
            pipeline.submit(c, own[j])
        got = pipeline.values()
        swapped = pool.pipeline()
        for j, c in enumerate(chunks[:4]):
            swapped.submit(c, own[(j + 1) % 4])
        with pytest.raises(PrecisionError, match="chunk 0"):
            swapped.values()
    finally:
        pool.close()
    assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]


def test_a_worker_dying_mid_measurement_is_retried_with_one_charge(tmp_path: Path,
                                                                     keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """A worker exits while decrypting (after the charge): a fresh pool decrypts the same chunks, the values
    equal the in-process path's, and the ledger holds one row. The secret reaches workers only through the pipe."""
    _, material, chunks = keys
    plain, _ = _release(tmp_path / "a", material, chunks, None)
    marker = tmp_path / "die-once"
    marker.touch()
    pool = DecryptPool(2, secret_bytes=bytes(material.secret_context.serialize(save_secret_key=True)),
                       die_marker=marker)
    try:
        pooled, handler = _release(tmp_path / "b", material, chunks, pool)
    finally:
        pool.close()
    assert not marker.exists() and pool.restarts == 1
    assert pooled.values.tobytes() == plain.values.tobytes()
    charges = handler.ledger.charges("s1")
    assert len(charges) == 1 and charges[0].epsilon == pytest.approx(0.5)
    assert [r.outcome for r in handler.arrivals.rows("s1")] == ["answered"]


def test_chunks_arriving_after_a_worker_died_are_decrypted_by_the_fresh_pool(
        tmp_path: Path, keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """The first chunk's worker dies; the rest of the stream arrives only once the pool knows it is broken (the
    order a fast death and a slow stream give): no chunk is refused, every value equals the in-process path's."""
    import time

    store, material, chunks = keys
    marker = tmp_path / "die-once"
    marker.touch()
    pool = DecryptPool(2, secret_path=store.secret_path, die_marker=marker)
    try:
        pipeline = pool.pipeline()
        pipeline.submit(chunks[0])
        deadline = time.monotonic() + 60
        while not getattr(pool._executor, "_broken", False) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert getattr(pool._executor, "_broken", False), "the worker did not die"
        for c in chunks[1:]:
            pipeline.submit(c)  # into the broken pool
        assert pipeline.failed() is None  # a dead worker is no refusal
        values = pipeline.values()
    finally:
        pool.close()
    backend = BfvBackend(material.secret_context)
    expected = [np.asarray(backend.deserialize_chunk(c).decrypt(), dtype=np.int64) for c in chunks]
    assert [v.tolist() for v in values] == [e.tolist() for e in expected]
    assert pool.restarts == 1 and not marker.exists()


def test_pool_sizes(keys: tuple[KeyStore, KeyMaterial, list[bytes]]) -> None:
    """0 or 1 worker: in-process (no processes); a negative count or a pool without a key is refused."""
    store, _, _ = keys
    assert not DecryptPool(0).active and not DecryptPool(1).active
    assert DecryptPool(2, secret_path=store.secret_path).active
    with pytest.raises(Exception, match="must be >= 0"):
        DecryptPool(-1)
    with pytest.raises(Exception, match="exactly one of secret_path or secret_bytes"):
        DecryptPool(2)


def test_the_default_worker_count(tmp_path: Path) -> None:
    """A decryption server without --decrypt-workers: min(cores, 8) workers (in-process on one core)."""
    cores = len(os.sched_getaffinity(0))
    assert default_decrypt_workers() == (min(cores, 8) if cores > 1 else 0)
    assert DecryptionConfig(tmp_path, insecure=True).decrypt_workers is None
    handle = create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True))
    try:
        pool = handle.handler.decrypt_pool
        assert pool is not None and pool.workers == default_decrypt_workers() and pool._executor is None
    finally:
        handle.stop()


def test_the_servicer_streams_chunks_to_the_workers_with_the_same_answers(cluster: Cluster) -> None:
    """Through gRPC, a signed study: the same request answered in-process and then with the DS's chunks streamed to
    its workers (which decrypt each c0 with the owners' aggregate c1) gets the same values; a chunk the workers
    refuse (owner b's c1 missing from the c0) is refused after its charge, in the one text of such refusals."""
    owners = ("a", "b")
    contract = cluster.open_study(domain_size=64, owners=owners, epsilon=10.0, signed=True)
    adv = AdversarialComputationServer(cluster.decryption(), contract,
                                       {o: cluster.signing_key(o)[0] for o in owners},
                                       blocky_histograms(64, owners=len(owners)))
    assert adv.forward() == 1
    m = PartitionSums(64, 0.1, 1, starts=(0, 16, 32, 48))
    chunks = adv.chunks(m, np.zeros(4, dtype=np.int64))
    first = adv.ask("r1", 0.5, m, chunks)  # one chunk: in-process under the default pool
    pool = DecryptPool(2, secret_path=KeyStore(cluster.root / "ds" / KEYS_DIR).secret_path, min_chunks=1)
    cluster.ds.handler.decrypt_pool = pool
    try:
        second = adv.ask("r1", 0.5, m, chunks)
        assert pool._executor is not None  # the workers decrypted it
        refused = adv.ask("r2", 0.5, m, adv.chunks(m, np.zeros(4, dtype=np.int64), aggregate=adv.uploads["a"]))
    finally:
        pool.close()
    assert first is not None and second is not None and np.array_equal(first, second)
    assert refused is None  # "refused after the charge" (AdversarialComputationServer.ask)
    # the repeat is answered from the first charge (the same draw, the same values): charged once; r2 paid too
    assert [c.release_id for c in cluster.decryption().budget("s1").charges] == ["r1", "r2"]
    assert [r.outcome for r in cluster.ds.handler.arrivals.rows("s1")] == ["answered", "answered", "refused"]
