"""A key per study at the single decryption server, through the real services: each study's own key (0600, found
again after a restart), legacy studies on the server key, the replay of one study's ciphertext in another, a
study's key against another study's uploads, and the erasure of an ended study's key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import numpy as np
import pytest

from he_partition.core.backend import ChunkedVector
from he_partition.he.bfv import BfvBackend, context_fingerprint, load_context
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError
from parties.data_owner.client import EncryptedHistogram

from .conftest import Cluster, join_cells

N = 64  # one chunk: small and fast


def _key_dir(cluster: Cluster) -> Path:
    return cluster.root / "ds" / "keys"


def _secret_of(cluster: Cluster, contract: StudyContract) -> BfvBackend:
    """The secret key `contract` names, read straight from the decryption server's key store (wherever it is kept):
    the stand-in for a key an owner colluding with the computation server recovered in that study."""
    for path in sorted(_key_dir(cluster).rglob("secret_context.bin")):
        ctx = load_context(path.read_bytes())
        public = path.with_name("public_context.bin").read_bytes()
        if context_fingerprint(public) == contract.context_fingerprint:
            return BfvBackend(ctx)
    raise AssertionError(f"no key of study {contract.study_id} in the key store")


def test_each_study_gets_its_own_key_kept_0600_and_found_again(cluster: Cluster) -> None:
    a = cluster.open_study(study_id="s-a", domain_size=N)
    b = cluster.open_study(study_id="s-b", domain_size=N)
    server_key = cluster.ds.handler.fingerprint
    assert len({a.context_fingerprint, b.context_fingerprint, server_key}) == 3
    for c in (a, b):
        d = _key_dir(cluster) / "studies" / c.study_id
        assert stat.S_IMODE(os.stat(d / "secret_context.bin").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(d).st_mode) & 0o077 == 0
        served = cluster.decryption().public_context(study_id=c.study_id)
        assert context_fingerprint(served) == c.context_fingerprint and not load_context(served).is_private()
        relayed = cluster.computation().public_context(study_id=c.study_id)
        assert context_fingerprint(relayed) == c.context_fingerprint
    assert cluster.open_study(study_id="s-a", domain_size=N) == a  # an idempotent re-open finds the same key
    cluster.restart_ds()
    assert cluster.computation().open_study(study_id="s-b", domain_size=N, epsilon=1.0, expected_owners=["a", "b", "c"],
                                            strategy="gap")[0] == b
    for owner, h in zip("abc", np.ones((3, N), dtype=np.int64)):
        cluster.owner(owner).submit("s-b", h)
    assert cluster.computation().run_release("s-b", epsilon=0.5).state == "DONE"


def test_a_study_opened_under_the_server_key_keeps_it(cluster: Cluster) -> None:
    """A ledger from before keys were per study: its studies name the server key and keep working on it."""
    handler = cluster.ds.handler
    keys, handler.study_keys = handler.study_keys, None  # as the server opened studies before
    try:
        old = cluster.open_study(study_id="s-old", domain_size=N)
        old_join = join_cells(cluster, (1, 2, 3, 4), study_id="j-old").contract
    finally:
        handler.study_keys = keys
    assert old.context_fingerprint == handler.fingerprint
    assert not (_key_dir(cluster) / "studies" / "j-old").exists()  # on the key holder's join key of version 1
    cluster.restart_ds()
    new = cluster.open_study(study_id="s-new", domain_size=N)
    assert new.context_fingerprint != old.context_fingerprint
    for c in (old, old_join):
        assert context_fingerprint(cluster.decryption().public_context(study_id=c.study_id)) == c.context_fingerprint
    for study in ("s-old", "s-new"):
        for owner, h in zip("abc", np.ones((3, N), dtype=np.int64)):
            cluster.owner(owner).submit(study, h)
        assert cluster.computation().run_release(study, epsilon=0.5).state == "DONE"


def _opened_chunk(cluster: Cluster, study: str, owner: str) -> bytes:
    """Owner `owner`'s upload of `study` as the computation server holds it once the study closed (opened)."""
    store = cluster.cs.handler.store
    sub = next(s for s in store.submissions(study) if s.owner_id == owner)
    return store.read_chunk(sub, 0)


def test_a_ciphertext_replayed_from_another_study_opens_nothing_of_it(secure_cluster: Cluster) -> None:
    """Cross-study replay: the computation server and owner "x" of study B (a one-owner study closed on x) take
    owner a's opened upload of study A, scale it by 1024 and upload it as x's own; B's release divided by 1024
    would be a's bins. With a key per study it decrypts under B's key: refused or noise, never a's bins."""
    cluster = secure_cluster
    hs = [np.arange(N) % 7 + 3, np.arange(N) % 5 + 1]
    cluster.open_study(study_id="s-a", domain_size=N, owners=("a", "b"))
    for owner, h in zip("ab", hs):
        cluster.owner(owner).submit("s-a", h)
    assert cluster.computation().run_release("s-a", epsilon=0.5).state == "DONE"  # A closed: its chunks opened
    b = cluster.open_study(study_id="s-b", domain_size=N, owners=("x",), strategy="hier")
    parse = BfvBackend(load_context(cluster.computation().public_context(study_id="s-b")))
    replayed = parse.deserialize_chunk(_opened_chunk(cluster, "s-a", "a"))
    for _ in range(10):
        replayed = replayed + replayed  # 1024 x a's prefix sums, under A's key
    enc = EncryptedHistogram("s-b", N, b.context_fingerprint, (parse.serialize_chunk(replayed),), b.contract_hash,
                             b.signed, b.holder_seal_keys)
    assert cluster.owner("x").upload(enc, idempotency_key="replay").committed
    try:
        rel = cluster.computation().run_release("s-b", epsilon=0.5)
    except ServiceError as refused:  # the decryption server refused the chunk (not made under B's key)
        assert refused.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        return
    assert rel.state == "DONE" and rel.summary is not None  # else: values of B's key, noise
    starts = [*rel.summary.starts, N]
    truth = np.array([hs[0][starts[i]:starts[i + 1]].sum() for i in range(len(starts) - 1)])
    got = np.asarray(rel.summary.sums, dtype=np.float64) / 1024
    assert not np.all(np.abs(got - truth) < 0.5), "study B's release gave study A's bins"


def test_one_studys_key_decrypts_no_other_studys_uploads(secure_cluster: Cluster) -> None:
    """The key of study A (read from the key store: what a colluding owner and the computation server could
    recover in A) against study B's uploads as the computation server holds them opened: noise, not B's data."""
    cluster = secure_cluster
    a = cluster.open_study(study_id="s-a", domain_size=N, owners=("x",))
    cluster.open_study(study_id="s-b", domain_size=N, owners=("a", "b"))
    h = np.arange(N) % 9 + 1
    cluster.owner("a").submit("s-b", h)
    cluster.owner("b").submit("s-b", np.ones(N, dtype=np.int64))
    assert cluster.computation().run_release("s-b", epsilon=0.5).state == "DONE"
    stolen = _secret_of(cluster, a)
    chunk = stolen.deserialize_chunk(_opened_chunk(cluster, "s-b", "a"))
    assert stolen.noise_budget(chunk) == 0  # not a ciphertext under A's key
    values = stolen.decrypt(ChunkedVector(N, (chunk,)), verified=True)
    assert not np.array_equal(values, np.cumsum(h)), "study A's key decrypted study B's upload"


def test_an_ended_studys_key_is_erased(cluster: Cluster) -> None:
    """A study ends when its budget is spent: its key files go, and every later use is refused, naming why."""
    contract = cluster.open_study(study_id="s-end", domain_size=N, epsilon=1.0)
    for owner, h in zip("abc", np.ones((3, N), dtype=np.int64)):
        cluster.owner(owner).submit("s-end", h)
    d = _key_dir(cluster) / "studies" / "s-end"
    assert cluster.computation().run_release("s-end", epsilon=0.5).state == "DONE"
    assert (d / "secret_context.bin").exists()  # half the budget left: the key stays
    assert cluster.computation().run_release("s-end", epsilon=0.5).state == "DONE"
    assert not (d / "secret_context.bin").exists() and not (d / "public_context.bin").exists()
    assert "budget" in (d / "erased.txt").read_text()
    with pytest.raises(ServiceError) as err:
        cluster.decryption().public_context(study_id="s-end")
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "erased" in err.value.details
    cluster.restart_ds()  # still erased, and the study's contract and ledger stay
    assert cluster.decryption().budget("s-end").remaining == 0
    assert cluster.decryption().get_study("s-end") == contract


def test_join_cells_replayed_from_another_join_study_decrypt_to_nothing_of_it(cluster: Cluster) -> None:
    """Join studies have their own join key too: cells of join study j1 sent as j2's are refused by j2's
    integrity check (on the former code both used the key holder's one join key and j2 released j1's cells)."""
    from .test_adversarial_cs import _pass_join_check

    values = (7000, 0, 3000, 12000)
    j1 = join_cells(cluster, values, study_id="j1")
    j2 = join_cells(cluster, (1, 1, 1, 1), study_id="j2")
    _pass_join_check(j2.decryption, j2.contract, j2.scheme)
    try:
        got = j2.decryption.decrypt_join_cells(study_id="j2", release_id="r1", release_epsilon=1.0,
                                               measurement=j2.measurement, contract_hash=j2.contract.contract_hash,
                                               cells=j1.cells, cell_count=4).values
    except ServiceError as refused:
        # after the charge, in the one text that names no check (the decryption server's no-oracle rule)
        assert "refused after the charge" in refused.details, refused.details
    else:
        assert not np.all(np.abs(np.asarray(got) - np.asarray(values)) < 100), "join study j2 released j1's cells"
    assert j1.contract.context_fingerprint != j2.contract.context_fingerprint


@pytest.mark.parametrize("on_disk", [True, False])
def test_the_study_key_store_keeps_finds_and_erases_each_studys_key(tmp_path: Path, on_disk: bool) -> None:
    """The key store alone, on disk and in memory: a key kept is found again (and only for its study), its
    workers' reference loads the same secret, and an erased key is gone with the reason kept."""
    from parties.decryption.keys import StudyKeyStore

    store = StudyKeyStore(tmp_path / "studies" if on_disk else None)
    key = store.generate()
    assert store.load("s1") is None and store.erased("s1") == ""
    store.keep("s1", key)
    again = store.load("s1")
    assert again is not None and again.fingerprint == key.fingerprint and store.load("s2") is None
    ref = store.secret_ref("s1")
    secret = load_context(Path(ref).read_bytes() if isinstance(ref, str) else ref)
    assert secret.is_private() and isinstance(ref, str) == on_disk
    assert store.erase("s1", "its budget is spent") and not store.erase("s1", "again")
    assert store.load("s1") is None and "its budget is spent" in store.erased("s1")
    if on_disk:
        assert sorted(p.name for p in (tmp_path / "studies" / "s1").iterdir()) == ["erased.txt"]
