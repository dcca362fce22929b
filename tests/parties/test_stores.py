"""One contract test per storage interface, run against the SQLite and the in-memory implementation."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import multiprocessing.synchronize
import sqlite3
import threading
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator

import pytest

from he_partition.core.accounting import RangeQuery
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.core.measurements import RangeCount
from parties.common.contract import StudyContract
from parties.common.errors import AlreadyExistsError, FailedPreconditionError, NotFoundError
from parties.computation.store import ComputationStore, ReleaseRecord, UploadMeta
from parties.computation.store_memory import MemoryComputationStore
from parties.computation.store_sqlite import SqliteComputationStore
from parties.decryption.ledger import DIRECT_KIND, LedgerStore, MemoryLedgerStore, SqliteLedgerStore

FP = "ab" * 32


def contract(study_id: str = "s1", epsilon: float = 1.0, owners: tuple[str, ...] = ("a", "b")) -> StudyContract:
    return StudyContract(study_id=study_id, domain_size=64, epsilon=epsilon, expected_owners=owners,
                         context_fingerprint=FP)


# ---------------------------------------------------------------------------------------- ledger
@pytest.fixture(params=["sqlite", "memory"])
def ledger_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], LedgerStore]]:
    opened: list[LedgerStore] = []

    def make() -> LedgerStore:
        s: LedgerStore = SqliteLedgerStore(tmp_path / "ledger.sqlite3") if request.param == "sqlite" \
            else MemoryLedgerStore()
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def test_ledger_studies_are_idempotent_and_immutable(ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    c = contract()
    assert store.create_study(c) == (c, False)
    assert store.create_study(contract()) == (c, True)
    with pytest.raises(AlreadyExistsError, match="different terms"):
        store.create_study(contract(epsilon=2.0))
    assert store.get_study("s1") == c
    assert store.list_studies() == [c]
    with pytest.raises(NotFoundError):
        store.get_study("nope")


def test_ledger_charges_add_up_exactly_and_refuse_overspending(ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    a = store.charge("s1", "r1", "prefix_differences", 0.2, 1.0)
    b = store.charge("s1", "r1", "partition_sums", 0.8, 1.0)
    assert (a.epsilon, b.epsilon) == (0.2, 0.8) and b.charge_id > a.charge_id
    assert store.spent("s1") == 1.0
    with pytest.raises(BudgetExhaustedError, match="has 0 left of 1"):
        store.charge("s1", "r2", "prefix_differences", 1e-6, 1e-6)
    assert [c.epsilon for c in store.charges("s1")] == [0.2, 0.8]


def test_ledger_checks_the_whole_release_before_its_first_charge(ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    store.charge("s1", "r1", "prefix_differences", 0.5, 0.5)
    with pytest.raises(BudgetExhaustedError, match="needs epsilon 0.6"):
        store.charge("s1", "r2", "prefix_differences", 0.1, 0.6)  # 0.1 fits, the release does not
    with pytest.raises(BudgetExhaustedError, match="past its declared epsilon 0.5"):
        store.charge("s1", "r1", "partition_sums", 0.1, 0.5)
    with pytest.raises(InvalidInputError, match="declared with epsilon 0.5"):
        store.charge("s1", "r1", "partition_sums", 0.1, 0.7)
    with pytest.raises(InvalidInputError, match="epsilon must be > 0"):
        store.charge("s1", "r3", "x", 0.0, 0.1)
    with pytest.raises(NotFoundError):
        store.charge("nope", "r1", "x", 0.1, 0.1)
    assert [c.epsilon for c in store.charges("s1")] == [0.5]
    # Float splits such as 0.1 + 0.2 + 0.7 must not be refused for rounding noise.
    store.charge("s1", "r4", "a", 0.1, 0.5)
    store.charge("s1", "r4", "b", 0.2, 0.5)
    store.charge("s1", "r4", "c", 0.2, 0.5)
    assert store.spent("s1") == pytest.approx(1.0, abs=1e-15)


def test_ledger_concurrent_charges_never_exceed_the_total(ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    ok: list[int] = []
    refused: list[int] = []

    def spend(i: int) -> None:
        try:
            store.charge("s1", f"r{i}", "partition_sums", 0.3, 0.3)
            ok.append(i)
        except BudgetExhaustedError:
            refused.append(i)

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 3 and len(refused) == 5
    assert store.spent("s1") == pytest.approx(0.9)


def test_sqlite_ledger_persists_across_reopen(tmp_path: Path) -> None:
    s = SqliteLedgerStore(tmp_path / "l.sqlite3")
    s.create_study(contract())
    s.charge("s1", "r1", "prefix_differences", 0.25, 0.25)
    s.close()
    s2 = SqliteLedgerStore(tmp_path / "l.sqlite3")
    try:
        assert [c.epsilon for c in s2.charges("s1")] == [0.25]
        assert s2.get_study("s1") == contract()
    finally:
        s2.close()


# ----------------------------------------------------------------------------------- computation
@pytest.fixture(params=["sqlite", "memory"])
def cstore(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ComputationStore]:
    s: ComputationStore = SqliteComputationStore(tmp_path / "cs", durable=False) if request.param == "sqlite" \
        else MemoryComputationStore()
    yield s
    s.close()


def meta(key: str = "k1", owner: str = "a", chunks: int = 3) -> UploadMeta:
    return UploadMeta("s1", owner, key, chunks, 64, FP)


def test_store_studies(cstore: ComputationStore) -> None:
    assert cstore.get_study("s1") is None
    cstore.put_study(contract())
    cstore.put_study(contract())
    assert cstore.get_study("s1") == contract()
    with pytest.raises(AlreadyExistsError):
        cstore.put_study(contract(epsilon=3.0))


def test_store_upload_lifecycle(cstore: ComputationStore) -> None:
    m = meta()
    cstore.start_upload(m)
    assert cstore.get_upload("s1", "a") == m
    cstore.put_chunk(m, 2, b"two")
    cstore.put_chunk(m, 0, b"zero")
    cstore.put_chunk(m, 0, b"zero")  # rewriting the same chunk is harmless
    assert cstore.received_chunks(m) == {0: 4, 2: 3}
    with pytest.raises(FailedPreconditionError, match="lacks 1 of 3 chunks \\(1\\)"):
        cstore.commit_upload(m)
    with pytest.raises(InvalidInputError):
        cstore.put_chunk(m, 3, b"x")
    cstore.put_chunk(m, 1, b"one")
    sub = cstore.commit_upload(m)
    assert sub.bytes_total == 10 and sub.meta == m
    assert cstore.commit_upload(m) == sub  # idempotent
    assert cstore.get_upload("s1", "a") is None
    assert cstore.submissions("s1") == [sub]
    assert [cstore.read_chunk(sub, i) for i in range(3)] == [b"zero", b"one", b"two"]
    cstore.start_upload(m)  # same upload again: a no-op
    with pytest.raises(AlreadyExistsError, match="under idempotency key k1"):
        cstore.start_upload(meta("k2"))
    cstore.discard_upload(m)  # never removes a committed submission
    assert cstore.read_chunk(sub, 1) == b"one"

    def opened(fail_at: int) -> Iterator[tuple[int, bytes]]:
        for i in range(3):
            if i == fail_at:
                raise InvalidInputError("the owner's chunk does not open")
            yield i, f"open-{i}".encode()

    with pytest.raises(InvalidInputError):  # a failure half way replaces nothing and leaves no staged file
        cstore.replace_chunks(sub, opened(fail_at=2))
    assert [cstore.read_chunk(sub, i) for i in range(3)] == [b"zero", b"one", b"two"]
    assert cstore.received_chunks(sub.meta) == {0: 4, 1: 3, 2: 3}
    cstore.replace_chunks(sub, opened(fail_at=3))
    assert [cstore.read_chunk(sub, i) for i in range(3)] == [b"open-0", b"open-1", b"open-2"]


def test_store_new_key_discards_the_old_partial(cstore: ComputationStore) -> None:
    old, new = meta("old"), meta("new")
    cstore.start_upload(old)
    cstore.put_chunk(old, 0, b"x")
    cstore.start_upload(new)
    assert cstore.get_upload("s1", "a") == new
    assert cstore.received_chunks(old) == {}
    with pytest.raises(NotFoundError):
        cstore.put_chunk(old, 1, b"y")
    cstore.discard_upload(new)
    assert cstore.get_upload("s1", "a") is None and cstore.received_chunks(new) == {}


def test_staged_chunks_count_only_once_synced(cstore: ComputationStore) -> None:
    m = meta()
    cstore.start_upload(m)
    cstore.put_chunk(m, 0, b"zero")
    staged = [cstore.stage_chunk(m, 1, b"one"), cstore.stage_chunk(m, 2, b"two")]
    assert cstore.received_chunks(m) == {0: 4}  # written, not durable: not acknowledged
    with pytest.raises(InvalidInputError):
        cstore.stage_chunk(m, 3, b"x")
    cstore.sync_chunks(m, staged)
    assert cstore.received_chunks(m) == {0: 4, 1: 3, 2: 3}
    sub = cstore.commit_upload(m)
    assert [cstore.read_chunk(sub, i) for i in range(3)] == [b"zero", b"one", b"two"]
    late = meta("k2", owner="b")
    cstore.start_upload(late)
    pending = [cstore.stage_chunk(late, 0, b"x")]
    cstore.discard_upload(late)
    with pytest.raises(NotFoundError):  # never into an upload that was discarded (or committed) meanwhile
        cstore.sync_chunks(late, pending)


def test_a_crash_before_the_sync_forgets_exactly_the_staged_chunks(tmp_path: Path) -> None:
    store = SqliteComputationStore(tmp_path / "cs")
    m = meta()
    store.start_upload(m)
    store.sync_chunks(m, [store.stage_chunk(m, 0, b"zero")])
    store.stage_chunk(m, 1, b"one")  # the server dies before this batch is synced
    store.close()
    reopened = SqliteComputationStore(tmp_path / "cs")
    try:
        assert reopened.received_chunks(m) == {0: 4}  # what a resume is told it holds: exactly the synced chunk
        reopened.start_upload(m)
        reopened.sync_chunks(m, [reopened.stage_chunk(m, i, d) for i, d in ((1, b"one"), (2, b"two"))])
        sub = reopened.commit_upload(m)
        assert [reopened.read_chunk(sub, i) for i in range(3)] == [b"zero", b"one", b"two"]
        assert not list((tmp_path / "cs" / "uploads").rglob("*.part"))  # the staged leftover went with the commit
    finally:
        reopened.close()


def test_store_submissions_are_per_owner_and_sorted(cstore: ComputationStore) -> None:
    for owner in ("b", "a"):
        m = meta(owner=owner, chunks=1)
        cstore.start_upload(m)
        cstore.put_chunk(m, 0, owner.encode())
        cstore.commit_upload(m)
    assert [s.owner_id for s in cstore.submissions("s1")] == ["a", "b"]
    assert cstore.get_submission("s1", "b") is not None and cstore.submissions("other") == []


def test_store_releases(cstore: ComputationStore) -> None:
    r1 = ReleaseRecord("rel-1", "s1", "RUNNING", 0.5, ("a",), "h", "2026-01-01T00:00:00Z", request_key="q1")
    r2 = ReleaseRecord("rel-2", "s2", "RUNNING", 1.0, ("a",), "h", "2026-01-02T00:00:00Z")
    cstore.save_release(r1)
    cstore.save_release(r2)
    done = ReleaseRecord("rel-1", "s1", "DONE", 0.5, ("a",), "h", "2026-01-01T00:00:00Z", request_key="q1",
                         summary_json="", seconds=1.5)
    cstore.save_release(done)
    assert cstore.get_release("rel-1") == done
    assert [r.release_id for r in cstore.list_releases()] == ["rel-1", "rel-2"]
    assert [r.release_id for r in cstore.list_releases("s2")] == ["rel-2"]
    assert cstore.release_by_request_key("s1", "q1") == done
    assert cstore.release_by_request_key("s1", "nope") is None and cstore.get_release("x") is None


def test_sqlite_store_survives_reopen_and_opens_read_only(tmp_path: Path) -> None:
    s = SqliteComputationStore(tmp_path / "cs")
    m = meta(chunks=1)
    s.put_study(contract())
    s.start_upload(m)
    s.put_chunk(m, 0, b"c")
    s.commit_upload(m)
    s.close()
    ro = SqliteComputationStore(tmp_path / "cs", read_only=True)
    try:
        assert ro.get_study("s1") == contract()
        assert ro.read_chunk(ro.submissions("s1")[0], 0) == b"c"
    finally:
        ro.close()
    with pytest.raises(NotFoundError, match="does not exist"):
        SqliteComputationStore(tmp_path / "elsewhere", read_only=True)


# ------------------------------------------------------------------------- direct range counts
def _pieces(ranges: list[tuple[int, int]], eps: float) -> list[tuple[RangeQuery, ...]]:
    return [RangeCount(64, eps, 1, lo=lo, hi=hi).privacy_pieces() for lo, hi in ranges]


MASK = Fraction(1, 2**20)


def test_direct_queries_are_charged_by_heaviest_overlap_seed_004(ledger_factory: Callable[[], LedgerStore]) -> None:
    """Seed 004's example: Q1, Q2 overlap and Q3 is apart -> 2 eps; Q4 meeting all three -> 3 eps.

    Each range starting after bin 0 also shows the decryption server its prefix behind a mask
    charged at 2^-20, so the exact charges are 2 eps + 2^-20 and then 3 eps + 2^-20.
    """
    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    eps = Fraction("0.1")
    first = store.charge_direct("s1", "dq-1", _pieces([(0, 10), (0, 15), (20, 30)], 0.1), "first")
    assert first.spent_direct == float(2 * eps + MASK)
    assert first.epsilon == float(2 * eps + MASK)
    assert first.charge is not None and first.charge.kind == DIRECT_KIND and first.charge.release_id == "dq-1"
    second = store.charge_direct("s1", "dq-2", _pieces([(8, 25)], 0.1))
    assert second.spent_direct == float(3 * eps + MASK)
    assert second.epsilon == float(eps)
    assert store.spent("s1") == pytest.approx(float(3 * eps + MASK), abs=1e-15)
    # sequential composition would have charged 4 eps + 2 masks
    assert [c.kind for c in store.charges("s1")] == [DIRECT_KIND, DIRECT_KIND]
    assert len(store.direct_pieces("s1")) == 6
    assert store.check_consistency() == []


def test_a_direct_batch_on_paid_ground_costs_nothing_and_writes_no_charge_row(
        ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    store.create_study(contract())
    assert store.charge_direct("s1", "dq-1", _pieces([(5, 10)], 0.5)).epsilon == 0.5  # its mask [0, 5): 2^-20
    again = store.charge_direct("s1", "dq-2", _pieces([(0, 3)], 0.25))  # bins 0-2 carry 0.25 + 2^-20 < 0.5
    assert again.epsilon == 0.0 and again.charge is None and again.spent_direct == 0.5
    assert len(store.charges("s1")) == 1
    assert store.claim_direct_decryption("s1", "dq-2", 0, 3, 0.25) == 0
    assert store.check_consistency() == []


def test_direct_batches_that_do_not_fit_change_nothing(ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    store.charge("s1", "rel-1", "partition_sums", 0.3, 0.8)  # a release reserving 0.8
    with pytest.raises(BudgetExhaustedError, match="nothing was charged or decrypted"):
        store.charge_direct("s1", "dq-1", _pieces([(0, 10)], 0.25))
    assert store.direct_pieces("s1") == []
    assert len(store.charges("s1")) == 1
    ok = store.charge_direct("s1", "dq-2", _pieces([(0, 10)], 0.2))
    # "left" is what the next request is checked against: total - max(spent, reserved) = 1 - (0.8 + 0.2), not
    # total - spent (0.5), which a next request could never get.
    assert ok.epsilon == 0.2 and ok.remaining == 0.0
    with pytest.raises(BudgetExhaustedError, match="has 0 left of 1"):
        store.charge_direct("s1", "dq-3", _pieces([(20, 30)], 0.01))


def test_direct_requests_are_idempotent_and_each_range_decrypts_once(
        ledger_factory: Callable[[], LedgerStore]) -> None:
    store = ledger_factory()
    store.create_study(contract())
    first = store.charge_direct("s1", "dq-1", _pieces([(3, 9), (3, 9)], 0.1))
    retry = store.charge_direct("s1", "dq-1", _pieces([(3, 9), (3, 9)], 0.1))
    assert retry.already_charged and retry.epsilon == first.epsilon and len(store.charges("s1")) == 1
    with pytest.raises(AlreadyExistsError, match="already charged for other ranges"):
        store.charge_direct("s1", "dq-1", _pieces([(3, 10)], 0.1))
    assert {store.claim_direct_decryption("s1", "dq-1", 3, 9, 0.1) for _ in range(2)} == {0, 1}
    with pytest.raises(FailedPreconditionError, match="no paid, not yet decrypted range"):
        store.claim_direct_decryption("s1", "dq-1", 3, 9, 0.1)  # a replay
    with pytest.raises(FailedPreconditionError, match="no paid"):
        store.claim_direct_decryption("s1", "dq-1", 3, 9, 0.2)  # more epsilon than paid for
    with pytest.raises(FailedPreconditionError, match="no paid"):
        store.claim_direct_decryption("s1", "dq-9", 3, 9, 0.1)  # never paid
    with pytest.raises(NotFoundError):
        store.charge_direct("nope", "dq-1", _pieces([(0, 1)], 0.1))


def test_direct_rows_are_append_only_in_sqlite(tmp_path: Path) -> None:
    store = SqliteLedgerStore(tmp_path / "l.sqlite3")
    store.create_study(contract())
    store.charge_direct("s1", "dq-1", _pieces([(1, 5)], 0.1))
    store.claim_direct_decryption("s1", "dq-1", 1, 5, 0.1)
    db = sqlite3.connect(tmp_path / "l.sqlite3")
    for sql in ("UPDATE direct_pieces SET epsilon = 1e-9", "DELETE FROM direct_pieces",
                "DELETE FROM direct_decryptions"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
    db.close()
    store.close()


def test_budgets_are_exact_no_tolerance_past_the_total(ledger_factory: Callable[[], LedgerStore]) -> None:
    """Exact decimal arithmetic: nothing fits after 0 left, not even 1e-12; float splits book exactly."""
    from fractions import Fraction

    from parties.decryption.ledger import available, exact_sum

    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    store.charge("s1", "rel-1", "partition_sums", 0.7, 0.7)
    assert available(1.0, store.charges("s1")) == 0.3  # exactly 3/10, not 0.30000000000000004
    store.charge("s1", "rel-2", "partition_sums", 0.3, 0.3)
    for tiny in (1e-12, 1e-15):  # the 1e-9 relative slack used to let these through
        with pytest.raises(BudgetExhaustedError):
            store.charge("s1", f"rel-{tiny}", "partition_sums", tiny, tiny)
    assert exact_sum(c.epsilon for c in store.charges("s1")) == 1  # exactly the total, never more
    # A strategy's float split (0.2 then 0.10000000000000003 of a declared 0.3) overshoots by an ulp: the last
    # share is booked at exactly what the release has left, so the release never passes what it declared.
    store.create_study(contract("s2", epsilon=0.3))
    store.charge("s2", "r", "prefix_differences", 0.2, 0.3)
    last = store.charge("s2", "r", "partition_sums", 0.10000000000000003, 0.3)
    assert last.epsilon == 0.1 and exact_sum(c.epsilon for c in store.charges("s2")) == Fraction(3, 10)
    assert available(0.3, store.charges("s2")) == 0.0
    assert store.check_consistency() == []


def test_a_refusal_with_only_float_dust_left_says_0(ledger_factory: Callable[[], LedgerStore]) -> None:
    """0.1 + 0.2 + 0.7 leaves 1.1e-16 of 1 in exact decimal arithmetic: no release can use it, and the
    refusal says 0 (as every command does), not 1.11022e-16."""
    store = ledger_factory()
    store.create_study(contract(epsilon=1.0))
    for k, eps in enumerate((0.1, 0.2, 0.7 - 1e-16)):
        store.charge("s1", f"r{k}", "prefix_differences", eps, eps)
    with pytest.raises(BudgetExhaustedError) as ei:
        store.charge("s1", "late", "prefix_differences", 1e-3, 1e-3)
    assert "has 0 left of 1" in str(ei.value) and "e-1" not in str(ei.value)


def _commit_in_own_process(directory: str, barrier: "multiprocessing.synchronize.Barrier",
                           results: "multiprocessing.queues.Queue[str]") -> None:
    """One stream's end in its own CS process: its own store on the shared data directory, then the commit."""
    store = SqliteComputationStore(Path(directory), durable=False)
    try:
        store.start_upload(meta())  # every stream begins the same upload: must not discard the others' chunks
        barrier.wait()
        _, first = store.commit_upload_once(meta())
        results.put("first" if first else "again")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(f"error: {exc!r}")
    finally:
        store.close()


def test_streams_in_several_processes_commit_one_upload_exactly_once(tmp_path: Path) -> None:
    """Four streams of one upload end together in four processes sharing the SQLite store: exactly one commits
    (and so folds and forwards), the others see it committed, and no chunk is lost."""
    ctx = multiprocessing.get_context("fork")
    setup = SqliteComputationStore(tmp_path / "cs", durable=False)
    m = meta()
    setup.start_upload(m)
    for i in range(3):
        setup.put_chunk(m, i, bytes([i]) * 8)
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_commit_in_own_process, args=(str(tmp_path / "cs"), barrier, results))
             for _ in range(4)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert outcomes == ["again", "again", "again", "first"], outcomes
    sub = setup.get_submission("s1", "a")
    assert sub is not None and sub.bytes_total == 24
    assert [setup.read_chunk(sub, i) for i in range(3)] == [bytes([i]) * 8 for i in range(3)]
    setup.close()
