"""A key-share holder's shares on its local worker pool: the in-process bytes, held until the charge, the same bytes
when a worker dies. Real SEAL key share, real SQLite ledger, real spawned workers."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.core.errors import BudgetExhaustedError
from he_partition.he.bfv import generate_secret_context
from he_partition.he.threshold.c1 import c1_bytes
from he_partition.he.threshold.keys import holder_keygen
from parties.common.contract import StudyContract
from parties.common.signing import generate_signing_key
from parties.common.util import write_private_file
from parties.decryption.keyshare.holder import ThresholdHolder, measurement_shares
from parties.decryption.keyshare.uploads import UploadC1Book, sign_c1_parts
from parties.decryption.keyshare.share_workers import holder_pool
from parties.decryption.workers import DecryptPool

SLOTS = 8192
DOMAIN = 5 * SLOTS + 100  # six upload chunks; the measurement reads five (chunk 4 unmeasured)
CHUNKS = [0, 1, 2, 3, 5]
FP = hashlib.sha256(b"the study's collective key").digest()
NOISE_KEY = b"n" * 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Holder 0's key share (also in a key store file, mode 0600), a signed one-owner study, its c1 book."""
    ctx = generate_secret_context()
    secret, _ = holder_keygen(ctx, b"holder-pool-test-seed-0123456789", 0)
    private, public = generate_signing_key()
    contract = StudyContract(study_id="pw", domain_size=DOMAIN, epsilon=10.0, expected_owners=("a",),
                             context_fingerprint=FP.hex(), strategy="hier", owner_keys={"a": public.hex()})
    moduli = [int(m.value()) for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]
    rng = np.random.default_rng(3)
    parts = [c1_bytes(np.stack([rng.integers(0, q, SLOTS, dtype=np.uint64) for q in moduli])) for _ in range(6)]
    book = UploadC1Book(ctx)
    book.accept(contract, [sign_c1_parts(private, study_id="pw", owner_id="a", idempotency_key="up-a",
                                         contract_hash=contract.contract_hash, parts=parts)])
    key_file = tmp_path_factory.mktemp("keys") / "secret.bin"
    write_private_file(key_file, secret.to_bytes())
    noise = rng.integers(-300, 300, DOMAIN).astype(np.int64)
    measured = rng.random(DOMAIN) < 0.7
    return {"ctx": ctx, "secret": secret, "contract": contract, "book": book, "key_file": key_file,
            "noise": noise, "measured": measured}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DecryptPool]:
    """Two workers; the first to find the file `die_marker` (none until a test writes it) exits."""
    p = holder_pool(2, die_marker=tmp_path_factory.mktemp("marker") / "die")
    try:
        yield p
    finally:
        p.close()


def _holder(s: dict[str, Any], path: Path, pool: DecryptPool | None = None, *, by_file: bool = False) -> ThresholdHolder:
    holder = ThresholdHolder(s["ctx"], s["secret"], 3, FP, NOISE_KEY, path, uploads=s["book"], pool=pool,
                             key_files=(lambda _: s["key_file"]) if by_file else None)
    holder.register_study(s["contract"])
    return holder


def _shares(s: dict[str, Any], holder: ThresholdHolder, charged: list[str], label: bytes = b"request-1",
            participants: tuple[int, ...] = ()) -> list[bytes]:
    got = measurement_shares(holder, label, "pw", CHUNKS, s["noise"], s["measured"], SLOTS,
                             lambda: charged.append("charged"), participants=participants)
    return list(got.shares)


def test_pooled_shares_are_the_in_process_shares(setup: dict[str, Any], pool: DecryptPool, tmp_path: Path) -> None:
    """Same key share, noise key and request: workers that read the key store file, and workers given the share's
    bytes, return the in-process bytes, chunk for chunk, for an N-of-N request and a t-of-N participant set; the
    first measurement has the workers compute c1 s_i, the second sends them the c1 s_i the holder kept."""
    plain = _holder(setup, tmp_path / "plain.sqlite")
    by_file = _holder(setup, tmp_path / "file.sqlite", pool, by_file=True)
    by_bytes = _holder(setup, tmp_path / "bytes.sqlite", pool)
    assert not plain.pooled(len(CHUNKS)) and by_file.pooled(len(CHUNKS)) and not by_file.pooled(3)
    assert by_file.key_ref("pw") == str(setup["key_file"]) and isinstance(by_bytes.key_ref("pw"), bytes)
    for participants in ((), (0, 2)):
        for request in (b"first/", b"second/"):
            label = request + bytes(participants)
            charged: list[str] = []
            want = _shares(setup, plain, charged, label, participants)
            assert len(want) == len(CHUNKS) and len(set(want)) == len(CHUNKS)
            assert _shares(setup, by_file, charged, label, participants) == want
            assert _shares(setup, by_bytes, charged, label, participants) == want
            assert charged == ["charged"] * 3  # each holder charged its request once
    assert pool._executor is not None and pool.restarts == 0  # the workers computed them
    # the c1 s_i the workers computed, kept in the holder for the next measurement, are the in-process ones
    assert sorted(by_file._products) == sorted(plain._products) and len(plain._products) == 2 * len(CHUNKS)
    for key, (product, moduli, bound) in plain._products.items():
        got = by_bytes._products[key]
        assert np.array_equal(got[0], product) and got[1:] == (moduli, bound)
    for h in (plain, by_file, by_bytes):
        h.close()


def test_a_refused_charge_returns_nothing_the_workers_computed(setup: dict[str, Any], pool: DecryptPool,
                                                                tmp_path: Path) -> None:
    """The workers compute every share before the charge; a refused charge drops them and records no answer."""
    holder = _holder(setup, tmp_path / "refused.sqlite", pool)

    def refuse() -> None:
        raise BudgetExhaustedError("study pw's budget is spent")

    with pytest.raises(BudgetExhaustedError):
        measurement_shares(holder, b"refused", "pw", CHUNKS, setup["noise"], setup["measured"], SLOTS, refuse)
    assert holder._db.execute("SELECT COUNT(*) FROM threshold_requests").fetchone()[0] == 0
    holder.close()


def test_a_dead_worker_is_replaced_and_the_shares_are_the_same(setup: dict[str, Any], pool: DecryptPool,
                                                               tmp_path: Path) -> None:
    """A worker killed during the measurement: a fresh pool computes the chunks not yet answered, the same bytes,
    and the request is charged once."""
    plain = _holder(setup, tmp_path / "plain.sqlite")
    charged: list[str] = []
    want = _shares(setup, plain, charged)
    holder = _holder(setup, tmp_path / "dying.sqlite", pool, by_file=True)
    marker = Path(pool._die_marker or "")
    marker.write_bytes(b"")
    restarts = pool.restarts
    assert _shares(setup, holder, charged) == want
    assert pool.restarts == restarts + 1 and not marker.exists() and charged == ["charged"] * 2
    holder.close()
    plain.close()
    assert os.stat(setup["key_file"]).st_mode & 0o777 == 0o600
