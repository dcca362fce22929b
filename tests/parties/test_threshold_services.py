"""K = 3 key-share holders through real services: mutual TLS, real gRPC servers on port 0, real
TenSEAL ciphertexts under the collective key, real SQLite ledgers (one per holder)."""
from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pytest

from he_partition.core.measurements import Measurement
from he_partition.core.noise import KeyedRandom, discrete_laplace
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from parties.common.config import ComputationConfig, DecryptionConfig
from parties.common.errors import ServiceError
from parties.common.server import ServerHandle
from parties.common.signing import generate_signing_key, stream_digest
from parties.computation.server import create_computation_server
from parties.decryption.handler import NOISE_STREAM
from parties.common.contract import canonical_json
from parties.decryption.keyshare.servicer import create_keyshare_server
from parties.decryption.ledger import backup_ledger
from tests.parties.conftest import CS_ID, FAST_RETRY, OPERATOR_APPROVAL, Cluster, Pki

from parties.computation.client import ComputationClient
from parties.data_owner.client import DataOwnerClient

HOLDERS = ("h1", "h2", "h3")
DOMAIN = 64
OWNERS = ("a", "b", "c")


def _histograms() -> list[np.ndarray]:
    rng = np.random.default_rng(29)
    return [rng.integers(0, 40, size=DOMAIN).astype(np.int64) for _ in OWNERS]


@dataclass
class Threshold:
    """Three key-share holders and a computation server in threshold mode, mutual TLS."""

    root: Path
    pki: Pki
    holders: list[ServerHandle]
    cs: ServerHandle
    cs_seed: int
    clients: list[Any] = field(default_factory=list)
    signing: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    reconnect_on_start: bool = False

    @classmethod
    def start(cls, root: Path, cs_seed: int = 12, pooled: Sequence[str] = ()) -> "Threshold":
        """`pooled`: holders that compute every measurement's shares on two local workers (however few chunks)."""
        pki = Pki(root / "pki")
        holders = [create_keyshare_server(cls._holder_config(root, pki, name, 0, 2 if name in pooled else None), name,
                                          HOLDERS).start() for name in HOLDERS]
        for name in pooled:
            holders[HOLDERS.index(name)].handler.pool.min_chunks = 1
        specs = tuple(f"{n}={h.target}" for n, h in zip(HOLDERS, holders))
        cs = create_computation_server(ComputationConfig(root / "cs", "", holders=specs, port=0, noise_seed=cs_seed,
                                                         tls=pki.tls(CS_ID, "computation"), executor="inprocess"))
        return cls(root, pki, holders, cs.start(), cs_seed)

    @staticmethod
    def _holder_config(root: Path, pki: Pki, name: str, port: int, workers: int | None = None) -> DecryptionConfig:
        seed = 100 + HOLDERS.index(name)
        return DecryptionConfig(root / name, port=port, noise_seed=seed, tls=pki.tls(name, "decryption"),
                                computation_ids=(CS_ID,), operator_keys=(OPERATOR_APPROVAL[1],),
                                decrypt_workers=workers)

    def stop_holder(self, i: int) -> None:
        self.holders[i].stop()

    def start_holder(self, i: int) -> None:
        port = self.holders[i].port
        self.holders[i] = create_keyshare_server(self._holder_config(self.root, self.pki, HOLDERS[i], port),
                                                 HOLDERS[i], HOLDERS).start()
        if self.reconnect_on_start:
            self.combiner.clients[i].wait_ready(timeout=60)  # the CS's channel, past gRPC's reconnect backoff

    def fail_fast_on_stopped_holders(self) -> None:
        """The CS's calls to a stopped holder give up after FAST_RETRY's short retries instead of the deployment's
        policy (about 1.5 s of backoff per call, several calls per release); in exchange every restarted holder is
        waited for (`start_holder`), so no call meets a channel still in its reconnect backoff. For tests that stop
        holders on purpose: what the release decides with a holder down is the same, only sooner."""
        for c in self.combiner.clients:
            c.retry = FAST_RETRY
        self.reconnect_on_start = True

    @property
    def combiner(self) -> Any:
        return self.cs.handler.decryption

    def computation(self) -> ComputationClient:
        c = ComputationClient(self.cs.target, retry=FAST_RETRY, tls=self.pki.tls("op", "operator"),
                              approval_key=OPERATOR_APPROVAL[0])
        self.clients.append(c)
        return c

    def owner(self, owner_id: str) -> DataOwnerClient:
        from parties.common.signing import generate_signing_key
        if owner_id not in self.signing:
            self.signing[owner_id] = generate_signing_key()
        c = DataOwnerClient(owner_id, computation=self.cs.target, retry=FAST_RETRY, progress=False,
                            tls=self.pki.tls(owner_id, "data_owner"), signing_key=self.signing[owner_id][0])
        self.clients.append(c)
        return c

    def open(self, study_id: str, owners: Sequence[str] = OWNERS, epsilon: float = 1.0, strategy: str = "hier",
             domain_size: int = DOMAIN) -> Any:
        """Open a signed study of `owners` (each one's signing key made on first use); its contract."""
        from parties.common.signing import generate_signing_key
        for o in owners:
            self.signing.setdefault(o, generate_signing_key())
        contract, _ = self.computation().open_study(
            study_id=study_id, domain_size=domain_size, epsilon=epsilon, expected_owners=list(owners),
            strategy=strategy, owner_keys={o: self.signing[o][1] for o in owners})
        return contract

    def open_and_submit(self, study_id: str, epsilon: float = 1.0, strategy: str = "hier") -> Any:
        contract = self.open(study_id, epsilon=epsilon, strategy=strategy)
        for o, h in zip(OWNERS, _histograms()):
            self.owner(o).submit(study_id, h)
        return contract

    def ledger(self, i: int) -> Any:
        return self.holders[i].handler.require_active().ledger

    def stop(self) -> None:
        """End the deployment (a test's last step). The commit-time folds still waiting out their quiet period are
        dropped first, as a stop may leave them (the next start or release sums the owners missing), rather than
        waited for: up to 1 s of every teardown."""
        for c in self.clients:
            c.close()
        self.cs.handler.folds.close(5.0)
        self.cs.stop()
        for h in self.holders:
            h.stop()


@pytest.fixture
def threshold(tmp_path: Path) -> Iterator[Threshold]:
    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()
        yield t
    finally:
        t.stop()


def test_each_study_gets_its_own_key_every_holder_agrees_on_and_a_restart_keeps_it(threshold: Threshold) -> None:
    digest, names, already = threshold.computation().setup_key()
    assert already and names == HOLDERS
    assert all(h.handler.deployed and h.handler.active is None for h in threshold.holders)
    first = threshold.open_and_submit("s-fp")
    second = threshold.open_and_submit("s-fp2")
    fp = first.context_fingerprint
    assert [h.handler.study_key("s-fp").fingerprint for h in threshold.holders] == [fp] * 3
    assert second.context_fingerprint != fp  # a key per study
    again, existed = threshold.computation().open_study(
        study_id="s-fp", domain_size=DOMAIN, epsilon=1.0, expected_owners=list(OWNERS), strategy="hier",
        owner_keys={o: threshold.signing[o][1] for o in OWNERS})
    assert existed and again.context_fingerprint == fp  # opened again: the same key, no new setup
    threshold.stop_holder(1)
    threshold.start_holder(1)
    assert threshold.holders[1].handler.study_key("s-fp").fingerprint == fp


def test_a_release_through_three_holders_is_done(threshold: Threshold) -> None:
    threshold.open_and_submit("s1")
    rel = threshold.computation().run_release("s1", epsilon=1.0)
    assert rel.state == "DONE", rel.error_message
    for i in range(3):
        assert sum(c.epsilon for c in threshold.ledger(i).charges("s1")) == pytest.approx(1.0)


def test_noise_tolerates_defaults_to_k_minus_1_and_k_or_more_is_refused_naming_it(threshold: Threshold) -> None:
    keys = {o: threshold.signing.setdefault(o, generate_signing_key())[1] for o in OWNERS}
    cs = threshold.computation()
    terms: dict[str, Any] = dict(domain_size=DOMAIN, epsilon=1.0, expected_owners=list(OWNERS), strategy="hier",
                                 owner_keys=keys)
    with pytest.raises(ServiceError) as err:
        cs.open_study(study_id="s-t3", noise_tolerates=3, **terms)
    assert err.value.code.name == "INVALID_ARGUMENT"
    assert "noise_tolerates is 3" in str(err.value) and "K = 3" in str(err.value)
    assert all("s-t3" not in {c.study_id for c in threshold.ledger(i).list_studies()} for i in range(3))
    default, _ = cs.open_study(study_id="s-default", **terms)
    assert default.noise_tolerates == 2 and default.to_dict()["noise_tolerates"] == 2
    zero, _ = cs.open_study(study_id="s-t0", noise_tolerates=0, **terms)
    assert zero.noise_tolerates == 0 and "noise_tolerates" not in zero.to_dict()
    for i in range(3):
        assert threshold.ledger(i).get_study("s-default").contract_hash == default.contract_hash


def test_the_single_decryption_server_refuses_noise_tolerates_above_0(cluster: Cluster) -> None:
    with pytest.raises(ServiceError) as err:
        cluster.open_study(study_id="s-t1", noise_tolerates=1)
    assert err.value.code.name == "INVALID_ARGUMENT"
    assert "noise_tolerates is 1" in str(err.value) and "K = 1" in str(err.value)
    assert cluster.open_study(study_id="s-t0").noise_tolerates == 0


class _Spy:
    """Records every measurement the computation server sends for decryption and the values it gets back.

    Wraps the real call (no stand-in): the chunks are materialized so their digest (the noise label) is known.
    """

    def __init__(self, decryption: Any) -> None:
        self.calls: list[tuple[dict[str, Any], np.ndarray]] = []
        self._real: Callable[..., Any] = decryption.decrypt_measurement
        decryption.decrypt_measurement = self

    def __call__(self, **kw: Any) -> Any:
        kw["chunks"] = list(kw["chunks"])
        result = self._real(**kw)
        self.calls.append((kw, np.asarray(result.values, dtype=np.int64)))
        return result


def _label(kw: dict[str, Any]) -> bytes:
    m: Measurement = kw["measurement"]
    return canonical_json({"study_id": kw["study_id"], "release_id": kw["release_id"],  # the DS's request label
                           "release_epsilon": float(kw["release_epsilon"]), "measurement": m.to_dict(),
                           "ciphertext_digest": stream_digest(kw["chunks"]).hex()}).encode("utf-8")


def _holder_label(kw: dict[str, Any]) -> bytes:
    """A key-share holder's label of the request: the measured chunks' signed c1 (what its shares decrypt)."""
    from he_partition.he.bfv import generate_secret_context
    from he_partition.he.threshold.c1 import c1_digest, c1_of_vector
    from parties.decryption.keyshare.holder import chunks_digest
    from parties.decryption.keyshare.holder import measurement_label as holder_label

    m: Measurement = kw["measurement"]
    ctx = generate_secret_context()
    index = [int(i) for i in m.measured_chunks(8192)]
    digest = chunks_digest([c1_digest(c1_of_vector(ctx, c)) for c in kw["chunks"]], index)
    return holder_label(kw["study_id"], kw["release_id"], float(kw["release_epsilon"]), canonical_json(m.to_dict()),
                        digest)


def _noise_key(data_dir: Path) -> bytes:
    return (data_dir / "keys" / "noise_key.bin").read_bytes()


def _single_holder_draw(root: Path, kw: dict[str, Any]) -> np.ndarray:
    """The single decryption server's keyed draw for one request (its noise key, the request label)."""
    m: Measurement = kw["measurement"]
    return discrete_laplace(m.scale, m.count, KeyedRandom(_noise_key(root / "ds"), _label(kw), stream=NOISE_STREAM))


def _holders_draws(root: Path, kw: dict[str, Any], tolerates: int = 2) -> np.ndarray:
    """The sum of the three holders' keyed shares for one request (each holder's noise key, the request label).

    Each share is drawn for K - T holders (T = noise_tolerates, by default K - 1 = 2: each share is a full
    discrete Laplace draw); the label still names K = 3."""
    m: Measurement = kw["measurement"]
    return sum(discrete_laplace_share(m.scale, 3 - tolerates, m.count, holder_noise_source(
        _noise_key(root / name), i, 3, b"dp/" + _holder_label(kw))) for i, name in enumerate(HOLDERS))  # type: ignore


def _run_study(open_and_submit: Callable[[], Any], client: ComputationClient) -> tuple[Any, Any, Any]:
    """(contract, release, direct answers) of one study run."""
    contract = open_and_submit()
    rel = client.run_release("s-eq", epsilon=0.5)
    assert rel.state == "DONE", rel.error_message
    return contract, rel, client.direct_range_counts("s-eq", [(0, 10), (5, 40), (17, 64)], 0.1)


def test_release_and_direct_queries_equal_the_single_key_path_once_the_holders_draws_are_accounted_for(
        tmp_path: Path) -> None:
    """Same data, same computation-server seed, K = 1 (one decryption server) and K = 3 (three holders).

    Compared, value for value, for every measurement the computation server sends (the release's
    hierarchical partition sums, then three direct range counts): the decrypted values minus the
    holder-side DP noise, i.e. data + the computation server's draw. K = 1's holder-side noise is the
    decryption server's keyed draw; K = 3's is the sum of the three holders' keyed shares, each
    recomputed here from the holder's noise key and the request label. Also compared: the
    measurements themselves (kind, partitions, epsilon, sensitivity) and their order. Holder h1
    computes its shares on its local workers (`share_workers`), h2 and h3 in their server process.
    """
    single = Cluster.start(tmp_path / "k1", cs_seed=12, secure=True)
    try:
        spy1 = _Spy(single.cs.handler.decryption)

        def open1() -> Any:
            contract = single.open_study(study_id="s-eq", domain_size=DOMAIN, epsilon=1.0, owners=OWNERS,
                                         strategy="hier")
            for o, h in zip(OWNERS, _histograms()):
                single.owner(o).submit("s-eq", h)
            return contract

        contract1, rel1, direct1 = _run_study(open1, single.computation())
    finally:
        single.stop(drop_pending_folds=True)
    k3 = Threshold.start(tmp_path / "k3", cs_seed=12, pooled=("h1",))
    try:
        k3.computation().setup_key()
        spy3 = _Spy(k3.combiner)
        contract3, rel3, direct3 = _run_study(lambda: k3.open_and_submit("s-eq"), k3.computation())
        pools = [h.handler.pool for h in k3.holders]
        assert pools[0]._executor is not None and pools[0].restarts == 0  # h1's workers computed its shares
        assert pools[1]._executor is None and pools[2]._executor is None
    finally:
        k3.stop()
    assert len(spy1.calls) == len(spy3.calls) >= 4
    for (kw1, v1), (kw3, v3) in zip(spy1.calls, spy3.calls):
        assert kw1["measurement"].to_dict() == kw3["measurement"].to_dict()
        if hasattr(kw1["measurement"], "starts"):
            assert kw1["measurement"].starts == kw3["measurement"].starts
        own1, own3 = _single_holder_draw(tmp_path / "k1", kw1), _holders_draws(tmp_path / "k3", kw3)
        assert (v1 - own1).tolist() == (v3 - own3).tolist()
        assert np.count_nonzero(own3) > 0 or len(own3) < 3  # the holders' noise is really there
    # K = 3 opens with noise_tolerates K - 1 = 2 by default: the holders' noise is K/(K - T) = 3 draws, so each
    # released value carries 1 + 3 = 4 draws' variance where the single key holder's carries 2
    assert (contract1.noise_tolerates, contract3.noise_tolerates) == (0, 2)
    assert rel1.summary.params.get("holder_noise") is None
    assert rel3.summary.params["holder_noise"] == {"key_holders": 3, "noise_tolerates": 2,
                                                   "holder_variance_factor": 3.0}
    assert rel3.summary.sum_variance == pytest.approx([2 * v for v in rel1.summary.sum_variance])
    assert [r.variance for r in rel3.summary.released] == pytest.approx([2 * r.variance
                                                                         for r in rel1.summary.released])
    assert [c.standard_error for c in direct3.counts] == pytest.approx([np.sqrt(2) * c.standard_error
                                                                        for c in direct1.counts])


class _Combines:
    """Counts the combiner's calls of `combine` (the only step that decrypts anything)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import parties.computation.threshold.decryption as mod
        self.calls = 0
        real = mod.combine

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls += 1
            return real(*a, **kw)

        monkeypatch.setattr(mod, "combine", counted)


def _fast(t: Threshold, outage: float = 0.0) -> None:
    for c in t.combiner.clients:
        c.retry = FAST_RETRY
        c.outage_seconds = outage


def _refused(t: Threshold, study: str, epsilon: float) -> tuple[str, str]:
    """(status code name, message) of a release that must not happen: refused up front or FAILED."""
    try:
        rel = t.computation().run_release(study, epsilon=epsilon)
    except ServiceError as exc:
        return exc.code.name, exc.details
    assert rel.state == "FAILED", rel.state
    return rel.error_code, rel.error_message


def _spent(t: Threshold, i: int, study: str) -> float:
    return sum(c.epsilon for c in t.ledger(i).charges(study))


def test_a_holder_down_before_the_release_stops_it_before_anything_is_charged_or_decrypted(
        threshold: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    threshold.open_and_submit("s-down")
    _fast(threshold)
    combines = _Combines(monkeypatch)
    threshold.stop_holder(2)
    code, message = _refused(threshold, "s-down", 0.5)  # refused at once (health checks), not after retries
    assert code == "FAILED_PRECONDITION" and "and h3 is not (" in message, message
    assert "nothing was charged or decrypted" in message
    # whether the uploads had closed before h3 stopped (in the background, at the last commit) or not
    assert "is 3-of-3: every key-share holder must be up" in message or "needs all 3 key-share holders" in message
    assert combines.calls == 0 and _spent(threshold, 0, "s-down") == 0 and _spent(threshold, 1, "s-down") == 0
    threshold.start_holder(2)  # back: the retry charges every holder once
    threshold.combiner.clients[2].wait_ready(timeout=15)  # the CS's channel reconnects (gRPC backoff)
    rel = threshold.computation().run_release("s-down", epsilon=0.5)
    assert rel.state == "DONE" and combines.calls > 0
    assert [_spent(threshold, i, "s-down") for i in range(3)] == [pytest.approx(0.5)] * 3


def test_a_holder_down_during_the_release_is_waited_for_and_nothing_is_charged_twice(
        threshold: Threshold) -> None:
    threshold.open_and_submit("s-mid")
    _fast(threshold, outage=20.0)
    combiner = threshold.combiner
    real = combiner.decrypt_measurement
    state = {"calls": 0}

    def outage_on_first_measurement(**kw: Any) -> Any:
        state["calls"] += 1
        if state["calls"] == 1:
            threshold.stop_holder(2)
            threading.Timer(1.0, threshold.start_holder, args=(2,)).start()
        return real(**kw)

    combiner.decrypt_measurement = outage_on_first_measurement
    rel = threshold.computation().run_release("s-mid", epsilon=0.5)
    assert rel.state == "DONE", rel.error_message
    rows = [[(c.release_id, c.kind, c.epsilon) for c in threshold.ledger(i).charges("s-mid")] for i in range(3)]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == state["calls"]  # one charge per measurement each


def test_a_holder_down_past_the_outage_window_fails_the_release_naming_it_and_nothing_is_decrypted(
        threshold: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    threshold.open_and_submit("s-gone")
    _fast(threshold)
    combines = _Combines(monkeypatch)
    real = threshold.combiner.decrypt_measurement

    def down_after_the_budget_check(**kw: Any) -> Any:
        threshold.stop_holder(1)
        return real(**kw)

    threshold.combiner.decrypt_measurement = down_after_the_budget_check
    code, message = _refused(threshold, "s-gone", 0.5)
    assert code == "UNAVAILABLE" and "key-share holder h2" in message
    assert combines.calls == 0


def test_a_holder_refusing_with_an_exhausted_ledger_stops_the_release_before_anything_is_decrypted(
        threshold: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    threshold.open_and_submit("s-refuse")
    threshold.ledger(2).charge("s-refuse", "elsewhere", "partition_sums", 1.0, 1.0)  # holder h3's view: all spent
    combines = _Combines(monkeypatch)
    code, _ = _refused(threshold, "s-refuse", 0.5)  # the honest CS reads every holder's budget first
    assert code == "RESOURCE_EXHAUSTED"
    assert _spent(threshold, 0, "s-refuse") == 0 and combines.calls == 0
    # a CS that skips the budget check (reads holder h1 only) still gets nothing: h3 refuses its shares
    monkeypatch.setattr(threshold.combiner, "budget", lambda study_id, **kw: threshold.combiner.clients[0].budget(
        study_id))
    code, message = _refused(threshold, "s-refuse", 0.5)
    assert code == "RESOURCE_EXHAUSTED" and "key-share holder h3" in message
    assert combines.calls == 0


def test_a_holder_with_a_rolled_back_ledger_cannot_make_the_study_overspend(
        threshold: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    threshold.open_and_submit("s-roll")
    old = threshold.root / "h1-ledger-before.sqlite3"
    backup_ledger(threshold.root / "h1" / "ledger.sqlite3", old)
    # 0.6 of 1.0: the study has not ended, so its key shares stand (a study that spent all is erased everywhere)
    assert threshold.computation().run_release("s-roll", epsilon=0.6).state == "DONE"
    threshold.stop_holder(0)
    for suffix in ("", "-wal", "-shm"):
        (threshold.root / "h1" / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
    shutil.copy(old, threshold.root / "h1" / "ledger.sqlite3")
    threshold.start_holder(0)
    assert _spent(threshold, 0, "s-roll") == 0  # h1 believes the budget is unspent
    combines = _Combines(monkeypatch)
    code, message = _refused(threshold, "s-roll", 0.6)  # the honest CS: h1 reports less spend than its receipts
    assert code == "FAILED_PRECONDITION" and "h1" in message, message
    # a CS without receipts that trusts h1's view: h2 and h3 refuse, nothing is decrypted
    threshold.combiner.clients[0].receipts = None
    monkeypatch.setattr(threshold.combiner, "budget", lambda study_id, **kw: threshold.combiner.clients[0].budget(
        study_id))
    code, message = _refused(threshold, "s-roll", 0.6)
    assert code == "RESOURCE_EXHAUSTED" and "key-share holder h2" in message
    assert combines.calls == 0
    assert _spent(threshold, 1, "s-roll") == pytest.approx(0.6) and _spent(threshold, 2, "s-roll") == pytest.approx(0.6)


def test_a_direct_query_does_not_show_the_combiner_the_prefix_count(threshold: Threshold,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The combiner's view of a direct range count [lo, hi) holds the prefix slot P[lo-1] + mu, mu the CS's own
    mask: a CS that knows (or skips, as here) its mask would read the exact count of [0, lo) unless the holders'
    shares noise that slot too. The attacker double records every combined slot vector of a direct query."""
    import parties.computation.threshold.decryption as mod
    from he_partition.core.measurements import RangeCount

    real_noise = RangeCount.computation_noise

    def no_mask(self: RangeCount, rng: Any) -> np.ndarray:  # a deviating CS: no prefix mask mu
        out = np.asarray(real_noise(self, rng)).copy()
        if self.lo > 0:
            out[0] = 0
        return out

    monkeypatch.setattr(RangeCount, "computation_noise", no_mask)
    seen: list[np.ndarray] = []
    real_combine = mod.combine

    def spy(*a: Any, **kw: Any) -> Any:
        got = real_combine(*a, **kw)
        seen.append(np.asarray(got, dtype=np.int64).copy())
        return got

    monkeypatch.setattr(mod, "combine", spy)
    threshold.open_and_submit("s-prefix", epsilon=1.0)
    lo, hi = 20, 40
    threshold.computation().direct_range_counts("s-prefix", [(lo, hi)], 0.5)
    truth = np.cumsum(np.sum(_histograms(), axis=0))
    t = 562949952847873
    prefix_seen = [int((v[lo - 1] + t // 2) % t - t // 2) for v in seen]
    assert prefix_seen, "no combined chunk was seen"
    assert int(truth[lo - 1]) not in prefix_seen, "the combiner read the exact prefix count"
    assert all(abs(p - int(truth[lo - 1])) > 50 for p in prefix_seen)  # noised at scale c / 2^-20
