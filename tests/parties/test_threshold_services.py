"""K = 3 key-share holders through real services (issue 29): mutual TLS, real gRPC servers on port 0, real
TenSEAL ciphertexts under the collective key, real SQLite ledgers (one per holder)."""
from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from he_partition.core.measurements import Measurement
from he_partition.core.noise import KeyedRandom, discrete_laplace
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from parties.common.config import ComputationConfig, DecryptionConfig
from parties.common.errors import ServiceError
from parties.common.server import ServerHandle
from parties.common.signing import stream_digest
from parties.computation.server import create_computation_server
from parties.decryption.keyshare import measurement_label
from parties.decryption.keyshare_servicer import create_keyshare_server
from parties.decryption.ledger import backup_ledger
from tests.parties.conftest import CS_ID, FAST_RETRY, Cluster, Pki

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

    @classmethod
    def start(cls, root: Path, cs_seed: int = 12) -> "Threshold":
        pki = Pki(root / "pki")
        holders = [create_keyshare_server(cls._holder_config(root, pki, name, 0), name, HOLDERS).start()
                   for name in HOLDERS]
        specs = tuple(f"{n}={h.target}" for n, h in zip(HOLDERS, holders))
        cs = create_computation_server(ComputationConfig(root / "cs", "", holders=specs, port=0, noise_seed=cs_seed,
                                                         tls=pki.tls(CS_ID, "computation"), executor="inprocess"))
        return cls(root, pki, holders, cs.start(), cs_seed)

    @staticmethod
    def _holder_config(root: Path, pki: Pki, name: str, port: int) -> DecryptionConfig:
        seed = 100 + HOLDERS.index(name)
        return DecryptionConfig(root / name, port=port, noise_seed=seed, tls=pki.tls(name, "decryption"),
                                computation_ids=(CS_ID,))

    def stop_holder(self, i: int) -> None:
        self.holders[i].stop()

    def start_holder(self, i: int) -> None:
        port = self.holders[i].port
        self.holders[i] = create_keyshare_server(self._holder_config(self.root, self.pki, HOLDERS[i], port),
                                                 HOLDERS[i], HOLDERS).start()

    @property
    def combiner(self) -> Any:
        return self.cs.handler.decryption

    def computation(self) -> ComputationClient:
        c = ComputationClient(self.cs.target, retry=FAST_RETRY, tls=self.pki.tls("op", "operator"))
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

    def open_and_submit(self, study_id: str, epsilon: float = 1.0, strategy: str = "hier") -> Any:
        from parties.common.signing import generate_signing_key
        for o in OWNERS:
            self.signing.setdefault(o, generate_signing_key())
        contract, _ = self.computation().open_study(
            study_id=study_id, domain_size=DOMAIN, epsilon=epsilon, expected_owners=list(OWNERS), strategy=strategy,
            owner_keys={o: self.signing[o][1] for o in OWNERS})
        for o, h in zip(OWNERS, _histograms()):
            self.owner(o).submit(study_id, h)
        return contract

    def ledger(self, i: int) -> Any:
        return self.holders[i].handler.require_active().ledger

    def stop(self) -> None:
        for c in self.clients:
            c.close()
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


def test_setup_gives_one_fingerprint_every_holder_agrees_on_and_a_restart_keeps_it(threshold: Threshold) -> None:
    fp, names, already = threshold.computation().setup_key()
    assert already and names == HOLDERS
    assert [h.handler.active.fingerprint for h in threshold.holders] == [fp] * 3
    threshold.stop_holder(1)
    threshold.start_holder(1)
    assert threshold.holders[1].handler.active.fingerprint == fp
    contract = threshold.open_and_submit("s-fp")
    assert contract.context_fingerprint == fp


def test_a_release_through_three_holders_is_done(threshold: Threshold) -> None:
    threshold.open_and_submit("s1")
    rel = threshold.computation().run_release("s1", epsilon=1.0)
    assert rel.state == "DONE", rel.error_message
    for i in range(3):
        assert sum(c.epsilon for c in threshold.ledger(i).charges("s1")) == pytest.approx(1.0)


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
    return measurement_label(kw["study_id"], kw["release_id"], float(kw["release_epsilon"]), m.to_dict(),
                             stream_digest(kw["chunks"]).hex())


def _noise_key(data_dir: Path) -> bytes:
    return (data_dir / "keys" / "noise_key.bin").read_bytes()


def _single_holder_draw(root: Path, kw: dict[str, Any]) -> np.ndarray:
    """The single decryption server's keyed draw for one request (its noise key, the request label)."""
    m: Measurement = kw["measurement"]
    return discrete_laplace(m.scale, m.count, KeyedRandom(_noise_key(root / "ds"), _label(kw)))


def _holders_draws(root: Path, kw: dict[str, Any]) -> np.ndarray:
    """The sum of the three holders' keyed shares for one request (each holder's noise key, the request label)."""
    m: Measurement = kw["measurement"]
    return sum(discrete_laplace_share(m.scale, 3, m.count, holder_noise_source(
        _noise_key(root / name), i, 3, b"dp/" + _label(kw))) for i, name in enumerate(HOLDERS))  # type: ignore


def _run_study(open_and_submit: Callable[[], Any], client: ComputationClient) -> None:
    open_and_submit()
    rel = client.run_release("s-eq", epsilon=0.5)
    assert rel.state == "DONE", rel.error_message
    client.direct_range_counts("s-eq", [(0, 10), (5, 40), (17, 64)], 0.1)


def test_release_and_direct_queries_equal_the_single_key_path_once_the_holders_draws_are_accounted_for(
        tmp_path: Path) -> None:
    """Same data, same computation-server seed, K = 1 (one decryption server) and K = 3 (three holders).

    Compared, value for value, for every measurement the computation server sends (the release's
    hierarchical partition sums, then three direct range counts): the decrypted values minus the
    holder-side DP noise, i.e. data + the computation server's draw. K = 1's holder-side noise is the
    decryption server's keyed draw; K = 3's is the sum of the three holders' keyed shares, each
    recomputed here from the holder's noise key and the request label. Also compared: the
    measurements themselves (kind, partitions, epsilon, sensitivity) and their order.
    """
    single = Cluster.start(tmp_path / "k1", cs_seed=12, secure=True)
    try:
        spy1 = _Spy(single.cs.handler.decryption)

        def open1() -> None:
            single.open_study(study_id="s-eq", domain_size=DOMAIN, epsilon=1.0, owners=OWNERS, strategy="hier")
            for o, h in zip(OWNERS, _histograms()):
                single.owner(o).submit("s-eq", h)

        _run_study(open1, single.computation())
    finally:
        single.stop()
    k3 = Threshold.start(tmp_path / "k3", cs_seed=12)
    try:
        k3.computation().setup_key()
        spy3 = _Spy(k3.combiner)
        _run_study(lambda: k3.open_and_submit("s-eq"), k3.computation())
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


class _Combines:
    """Counts the combiner's calls of `combine` (the only step that decrypts anything)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import parties.computation.threshold as mod
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
    code, message = _refused(threshold, "s-down", 0.5)
    assert code == "UNAVAILABLE" and "key-share holder h3" in message
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
    assert threshold.computation().run_release("s-roll", epsilon=1.0).state == "DONE"
    threshold.stop_holder(0)
    for suffix in ("", "-wal", "-shm"):
        (threshold.root / "h1" / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
    shutil.copy(old, threshold.root / "h1" / "ledger.sqlite3")
    threshold.start_holder(0)
    assert _spent(threshold, 0, "s-roll") == 0  # h1 believes the budget is unspent
    combines = _Combines(monkeypatch)
    code, message = _refused(threshold, "s-roll", 1.0)  # the honest CS: h1 reports less spend than its receipts
    assert code == "FAILED_PRECONDITION" and "h1" in message, message
    # a CS without receipts that trusts h1's view: h2 and h3 refuse, nothing is decrypted
    threshold.combiner.clients[0].receipts = None
    monkeypatch.setattr(threshold.combiner, "budget", lambda study_id, **kw: threshold.combiner.clients[0].budget(
        study_id))
    code, message = _refused(threshold, "s-roll", 1.0)
    assert code == "RESOURCE_EXHAUSTED" and "key-share holder h2" in message
    assert combines.calls == 0
    assert _spent(threshold, 1, "s-roll") == pytest.approx(1.0) and _spent(threshold, 2, "s-roll") == pytest.approx(1.0)


def _as_computation_server(t: Threshold, i: int) -> Any:
    """A client of holder i with the computation server's certificate (a deviating CS, played by the test)."""
    from parties.decryption.keyshare_client import KeyShareClient
    c = KeyShareClient(HOLDERS[i], t.holders[i].target, retry=FAST_RETRY, tls=t.pki.tls(CS_ID, "computation"))
    t.clients.append(c)
    return c


def test_one_share_per_ciphertext_and_wrong_shares_are_refused_through_the_services(threshold: Threshold) -> None:
    threshold.open_and_submit("s-share")
    spy = _Spy(threshold.combiner)
    assert threshold.computation().run_release("s-share", epsilon=0.5).state == "DONE"
    kw, values = spy.calls[0]
    h1 = _as_computation_server(threshold, 0)
    ask = {k: kw[k] for k in ("study_id", "release_id", "release_epsilon", "measurement", "chunks")}
    ask["contract_hash"] = kw["contract_hash"]
    again = h1.issue_shares(**ask)  # the very same request: the stored bytes, charged once
    assert again.repeated and _spent(threshold, 0, "s-share") == pytest.approx(0.5)
    with pytest.raises(ServiceError) as err:  # the same ciphertexts under another release: a second share refused
        h1.issue_shares(**{**ask, "release_id": "rel-other"})
    assert err.value.code.name == "FAILED_PRECONDITION" and "already issued" in err.value.details
    # a combiner handed holder h1's share in holder h2's place refuses to combine
    from he_partition.core.errors import InvalidInputError
    from he_partition.he.threshold_context import vector_ciphertext
    from he_partition.he.threshold_decrypt import combine
    shares = [_as_computation_server(threshold, i).issue_shares(**ask).shares[0] for i in range(3)]
    ct = vector_ciphertext(kw["chunks"][0])
    fp = bytes.fromhex(threshold.holders[0].handler.active.fingerprint)
    with pytest.raises(InvalidInputError):
        combine(threshold.combiner._template, ct, [shares[0], shares[0], shares[2]], [0, 1, 2], fp)
    with pytest.raises(InvalidInputError):
        combine(threshold.combiner._template, vector_ciphertext(spy.calls[1][0]["chunks"][0]), shares, [0, 1, 2], fp)


def test_a_rogue_key_gets_nothing_from_the_holders_or_the_owners(threshold: Threshold) -> None:
    from he_partition.core.errors import InvalidInputError
    from he_partition.he.bfv import context_fingerprint, generate_secret_context, public_context_bytes
    from parties.common.contract import StudyContract
    from parties.common.signing import generate_signing_key

    rogue = public_context_bytes(generate_secret_context())  # the CS's own key pair: it could decrypt alone
    contract = threshold.open_and_submit("s-rogue-ok")
    # owners check the context against the contract's fingerprint: a CS serving its own key gets no upload
    threshold.combiner._context = rogue
    keys = {o: generate_signing_key() for o in OWNERS}
    threshold.signing.update(keys)
    contract2, _ = threshold.computation().open_study(
        study_id="s-rogue", domain_size=DOMAIN, epsilon=1.0, expected_owners=list(OWNERS), strategy="hier",
        owner_keys={o: keys[o][1] for o in OWNERS})
    assert contract2.context_fingerprint == contract.context_fingerprint != context_fingerprint(rogue)
    with pytest.raises(InvalidInputError, match="is not the key of study"):
        threshold.owner("a").submit("s-rogue", _histograms()[0])
    # a contract naming another key (written into a holder's ledger) gets no share from that holder
    foreign = StudyContract.create(study_id="s-foreign", domain_size=DOMAIN, epsilon=1.0,
                                   expected_owners=list(OWNERS), context_fingerprint=context_fingerprint(rogue),
                                   strategy="hier")
    threshold.ledger(0).create_study(foreign)
    threshold.combiner._context = None
    threshold.open_and_submit("s-real")
    spy = _Spy(threshold.combiner)
    assert threshold.computation().run_release("s-real", epsilon=0.5).state == "DONE"
    spy_kw = spy.calls[0][0]
    with pytest.raises(ServiceError) as err:
        _as_computation_server(threshold, 0).issue_shares(
            study_id="s-foreign", release_id="rel-x", release_epsilon=0.5, measurement=spy_kw["measurement"],
            chunks=spy_kw["chunks"], contract_hash=foreign.contract_hash)
    assert err.value.code.name == "FAILED_PRECONDITION" and "not holder h1's collective key" in err.value.details
    assert _spent(threshold, 0, "s-foreign") == 0


def test_a_holder_answers_the_full_key_rpcs_and_joins_with_failed_precondition(threshold: Threshold) -> None:
    from parties.common.signing import generate_signing_key

    contract = threshold.open_and_submit("s-full")
    h1 = _as_computation_server(threshold, 0)
    with pytest.raises(ServiceError) as err:
        h1.decrypt_measurement(study_id="s-full", release_id="r", release_epsilon=0.5,
                               measurement=_partition_sums(), chunks=[b"x"], chunk_count=1,
                               contract_hash=contract.contract_hash)
    assert err.value.code.name == "FAILED_PRECONDITION" and "key-share holder 'h1'" in err.value.details
    keys = {o: generate_signing_key() for o in ("a", "b")}
    with pytest.raises(ServiceError) as err:
        threshold.computation().open_study(study_id="s-join", domain_size=DOMAIN, epsilon=1.0,
                                           expected_owners=["a", "b"], strategy="join",
                                           owner_keys={o: k[1] for o, k in keys.items()})
    assert err.value.code.name == "FAILED_PRECONDITION" and "joins use a single key holder" in err.value.details


def _partition_sums() -> Measurement:
    from he_partition.core.measurements import PartitionSums
    return PartitionSums(domain_size=DOMAIN, epsilon=0.5, sensitivity=1, starts=(0, 32))


@pytest.mark.slow
def test_a_threshold_deployment_through_the_cli_processes(tmp_path: Path) -> None:
    """Three `dpagg serve-decryption --key-share` processes, `serve-computation --holder ...`, `dpagg setup-key`, a
    signed study, two uploads and a release, all as real processes with mutual TLS."""
    import json
    import subprocess
    import sys

    from tests.parties.test_cli import _creds, _env, _wait_port, dpagg

    dpagg(tmp_path, "certs", "--out", "pki", "--party", "h1:decryption", "--party", "h2:decryption", "--party",
          "h3:decryption", "--party", "cs:computation", "--party", "op:operator", "--party", "o1:data_owner",
          "--party", "o2:data_owner", "--signing-keys")
    env = _env(tmp_path)
    procs: list[subprocess.Popen[str]] = []

    def serve(*args: str) -> str:
        name = args[args.index("--port-file") + 1]
        procs.append(subprocess.Popen([sys.executable, "-m", "parties.cli", *args], cwd=tmp_path, env=env,
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        return f"127.0.0.1:{_wait_port(tmp_path / name, procs[-1])}"

    try:
        targets = [serve("serve-decryption", "--key-share", h, "--holders", ",".join(HOLDERS), "--data-dir", h,
                         "--port", "0", "--port-file", f"{h}.port", "--computation-id", "cs", *_creds(h))
                   for h in HOLDERS]
        cs = serve("serve-computation", "--data-dir", "cs", "--port", "0", "--port-file", "cs.port",
                   "--executor", "inprocess", *[a for h, t in zip(HOLDERS, targets) for a in ("--holder", f"{h}={t}")],
                   *_creds("cs"))
        first = dpagg(tmp_path, "setup-key", "--computation", cs, *_creds("op")).stdout
        fp = first.split()[2]
        assert len(fp) == 64 and "set up" in first and "h1, h2, h3" in first
        assert "already active" in dpagg(tmp_path, "setup-key", "--computation", cs, *_creds("op")).stdout
        opened = json.loads(dpagg(tmp_path, "open-study", "--computation", cs, "--study-id", "thr", "--domain",
                                  "age:0:100:20", "--epsilon", "1", "--owners", "o1,o2", "--strategy", "hier",
                                  "--owner-keys-dir", "pki", "--json", *_creds("op")).stdout)
        assert opened["context_fingerprint"] == fp
        from parties.data_owner.dataset import write_sample_csv
        for i, owner in enumerate(("o1", "o2")):
            write_sample_csv(tmp_path / f"{owner}.csv", seed=3, n_records=300, owner_index=i)
            dpagg(tmp_path, "submit", "--computation", cs, "--study", "thr", "--owner", owner, "--csv",
                  f"{owner}.csv", "--person-column", "person_id", "--signing-key", f"pki/{owner}.signing.key",
                  *_creds(owner))
        rel = json.loads(dpagg(tmp_path, "release", "run", "thr", "--epsilon", "rest", "--computation", cs, "--json",
                               *_creds("op")).stdout)
        assert rel["state"] == "DONE" and rel["summary"]["domain_size"] == 20
        for h, t in zip(HOLDERS, targets):  # every holder charged its own ledger for the whole release
            budget = json.loads(dpagg(tmp_path, "budget", "thr", "--decryption", t, "--json", *_creds("op")).stdout)
            assert budget["spent"] == pytest.approx(1.0), h
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_a_rogue_key_share_in_the_setup_is_refused_by_every_holder_and_activates_nothing(tmp_path: Path) -> None:
    """A relay (the test, with the computation server's certificate) swaps holder h3's revealed key share for one
    it made itself on the same common seed: every holder checks it against h3's commitment and stops the setup."""
    import secrets as pysecrets

    from he_partition.he.bfv import generate_secret_context
    from he_partition.he.threshold_keys import holder_keygen
    from he_partition.he.threshold_setup import common_seed

    t = Threshold.start(tmp_path)
    try:
        hs = [_as_computation_server(t, i) for i in range(3)]
        session = pysecrets.token_bytes(16)

        def step(name: str, messages: dict[int, bytes] | None = None) -> dict[int, bytes]:
            return {i: h.key_setup(name, session, HOLDERS, messages).message for i, h in enumerate(hs)}

        seeds = step("reveal_seed", step("commit_seed"))
        reveals = step("reveal_key", step("commit_key", seeds))
        _, rogue = holder_keygen(generate_secret_context(), common_seed(session, seeds), 2)
        for h in hs:
            with pytest.raises(ServiceError) as err:
                h.key_setup("build_key", session, HOLDERS, {**reveals, 2: rogue})
            assert err.value.code.name == "INVALID_ARGUMENT" and "holder 2" in err.value.details
        with pytest.raises(ServiceError) as err:  # a holder list other than the holder's own configuration
            hs[0].key_setup("commit_seed", session, ("h1", "h2", "evil"))
        assert err.value.code.name == "INVALID_ARGUMENT" and "configured" in err.value.details
        assert all(h.handler.active is None for h in t.holders)
        fp, _, already = t.computation().setup_key()  # an honest setup afterwards: a new session
        assert not already and [h.handler.active.fingerprint for h in t.holders] == [fp] * 3
    finally:
        t.stop()


def test_malformed_setup_steps_and_chunks_are_refused_with_the_problem_named_and_nothing_charged(
        threshold: Threshold) -> None:
    from he_partition.he.bfv import _varint

    threshold.open_and_submit("s-bad")
    spy = _Spy(threshold.combiner)
    assert threshold.computation().run_release("s-bad", epsilon=0.5).state == "DONE"
    kw = spy.calls[0][0]
    h1 = _as_computation_server(threshold, 0)
    before = _spent(threshold, 0, "s-bad")
    framed_junk = bytes([2 << 3 | 2]) + _varint(5) + b"junk!"  # a TenSEAL vector frame around non-SEAL bytes
    for junk in (b"x", framed_junk):
        with pytest.raises(ServiceError) as err:
            h1.issue_shares(study_id="s-bad", release_id="rel-junk", release_epsilon=0.5,
                            measurement=kw["measurement"], chunks=[junk] * len(kw["chunks"]),
                            contract_hash=kw["contract_hash"])
        assert err.value.code.name == "INVALID_ARGUMENT" and "nothing was charged" in err.value.details
    assert _spent(threshold, 0, "s-bad") == before
    for step, session, messages in (("commit_seed", b"short", None), ("reveal_seed", b"s" * 16, {7: b"x"}),
                                    ("nonsense", b"s" * 16, None)):
        with pytest.raises(ServiceError) as err:
            h1.key_setup(step, session, HOLDERS, messages)
        assert err.value.code.name in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), err.value
    assert threshold.holders[0].handler.active is not None  # an active key is never replaced


def test_the_combiner_reads_nothing_in_the_unmeasured_slots(threshold: Threshold) -> None:
    """The CS knows its own pads, so the holders pad every slot a measurement does not use: a combiner (the test,
    with the CS's certificate) that sends an unpadded ciphertext of known values reads the measured slots (plus the
    holders' DP noise) and nothing else."""
    import tenseal as ts

    from he_partition.core.measurements import PartitionSums
    from he_partition.he.bfv import load_context
    from he_partition.he.threshold_context import vector_ciphertext
    from he_partition.he.threshold_decrypt import combine

    contract = threshold.open_and_submit("s-pads")
    ctx = load_context(threshold.combiner.public_context())
    slots = 8192
    values = (np.arange(slots) * 7 + 1000).tolist()
    chunk = bytes(ts.bfv_vector(ctx, values).serialize())
    m = PartitionSums(domain_size=DOMAIN, epsilon=0.5, sensitivity=1, starts=(0, 16, 32, 48))
    shares = [_as_computation_server(threshold, i).issue_shares(
        study_id="s-pads", release_id="rel-pads", release_epsilon=0.5, measurement=m, chunks=[chunk],
        contract_hash=contract.contract_hash).shares[0] for i in range(3)]
    fp = bytes.fromhex(contract.context_fingerprint)
    got = combine(threshold.combiner._template, vector_ciphertext(chunk), shares, [0, 1, 2], fp)
    t = 562949952847873
    offset = (got - np.array(values)) % t
    offset = np.where(offset > t // 2, offset - t, offset)
    ends = [15, 31, 47, 63]
    assert np.all(np.abs(offset[ends]) < 10_000)  # the values there, plus the holders' (cumulative) DP noise
    others = np.setdiff1d(np.arange(slots), ends)
    assert np.all(np.abs(offset[others]) > 10_000)  # everywhere else: uniform pads mod t (P[|x| < 10^4] ~ 2^-35)
