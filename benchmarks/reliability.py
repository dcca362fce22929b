#!/usr/bin/env python
"""Reliability run: load, starvation and faults against real `dpagg serve-*` processes on loopback.

    python benchmarks/reliability.py                          # every scenario (~3 min on 2 cores)
    python benchmarks/reliability.py --only starvation,busy   # some of them
    python benchmarks/reliability.py --large-bins 65536 --duration 5 --no-write   # a quick look

Every server is its own process on port 0 (or on its former port when it is restarted),
started here and stopped here, on failure too. Scenarios:

1. starvation: mutual TLS (a throwaway CA and certificates made with parties.common.pki, as
   `dpagg certs` does); a few releases, one of `--large-bins` bins (its summary is large).
   Two analysts hammer ListReleases and RangeCounts of 1,000 ranges with short deadlines from
   `--threads` threads each, while an operator calls StudyStatus and a data owner UploadStatus
   once per 0.2 s. Reported: p50/p99/max latency of the operator's and the owner's calls and
   how many were refused busy (no retries for them: one attempt each). Acceptance: every one
   of their calls answers, within 1 s. (On a release whose summary uses the tree estimator, as
   `auto` picks for one owner at 2^20 bins, each range costs O(leaves): a 1,000-range call then
   takes minutes and always ends at its deadline; see docs/scaling.md.)
2. oversized: eight ~57 MiB RangeCounts requests at a computation server (raw bytes on a channel
   that may send 64 MiB): all RESOURCE_EXHAUSTED, its peak RSS (VmHWM) before and after, and
   health still SERVING.
3. busy: `--clients` concurrent SDK clients (each its own analyst certificate) each run heavy
   RangeCounts (of a 4,096-bin release, or the large one with --busy-large); the share that
   fails, once with the SDK's retry policy (a "server busy" refusal is retried within the call's
   deadline) and once with one attempt only.
4. kill: the decryption server, then the computation server, is killed with SIGKILL once a
   release has been charged on the ledger, and restarted on the same data directory and port.
   Checked: the ledger never spends more than the study's budget, the interrupted release
   ends FAILED (or DONE) rather than hanging, and a release of the rest of the budget then
   succeeds. Reported: seconds from the restart to SERVING and to the next release's summary.
5. sigterm: a computation server with heavy calls in flight (RangeCounts, a silent upload
   stream) gets SIGTERM; reported: seconds until the process has exited.

Writes benchmarks/results/reliability.json unless --no-write.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from parties.analyst.client import AnalystClient  # noqa: E402
from parties.common.config import GRPC_OPTIONS, RetryPolicy  # noqa: E402
from parties.common.errors import ServiceError  # noqa: E402
from parties.common.pki import create_ca, issue_party_certificate  # noqa: E402
from parties.common.signing import generate_signing_key  # noqa: E402
from parties.common.tls import TlsConfig  # noqa: E402
from parties.computation.client import ComputationClient  # noqa: E402
from parties.data_owner.client import DataOwnerClient  # noqa: E402
from parties.decryption.client import DecryptionClient  # noqa: E402
from parties.wire.v1 import analyst_pb2, common_pb2  # noqa: E402

SCENARIOS = ("starvation", "oversized", "busy", "kill", "sigterm")
ONCE = RetryPolicy(attempts=1)
SMALL_BINS = 4096
DS_ID, CS_ID, OPERATOR_ID, OWNER_ID = "ds-1", "cs-1", "op", "owner-1"


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of a running process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def quantiles(seconds: list[float]) -> dict[str, float | int | None]:
    if not seconds:
        return {"calls": 0, "p50_s": None, "p99_s": None, "max_s": None}
    a = np.asarray(seconds)
    return {"calls": len(seconds), "p50_s": round(float(np.percentile(a, 50)), 4),
            "p99_s": round(float(np.percentile(a, 99)), 4), "max_s": round(float(a.max()), 4)}


@dataclass
class Server:
    """One `dpagg serve-*` process; `restart` brings it back on the same port and data directory."""

    name: str
    args: list[str]
    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self, timeout: float = 60.0) -> "Server":
        port_file = self.workdir / f"{self.name}.port"
        port_file.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "parties.cli", *self.args, "--port", str(self.port),
                                          "--port-file", str(port_file)],
                                         cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()  # a process that hangs before listening is not left behind
                raise RuntimeError(f"{self.name} server did not start; log tail:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            print(f"warning: {self.name} ignored SIGTERM for 20 s; killing it", file=sys.stderr)
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Deployment:
    """A decryption and a computation server, mutual TLS (`certs`) or --insecure, and their clients."""

    workdir: Path
    certs: Path | None
    ds: Server
    cs: Server
    issued: set[str] = field(default_factory=set)
    ca: Any = None
    signing: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    strategy: str = "auto"
    #: The operator's study approval key (private, public): the key holder pins it, open_study signs with it.
    approval: tuple[bytes, bytes] = field(default_factory=generate_signing_key)

    @classmethod
    def start(cls, workdir: Path, *, secure: bool, strategy: str = "auto") -> "Deployment":
        workdir.mkdir(parents=True, exist_ok=True)
        certs = workdir / "pki" if secure else None
        dep = cls(workdir, certs, Server("ds", [], workdir), Server("cs", [], workdir), strategy=strategy)
        if certs is not None:
            dep.ca = create_ca(certs)
        dep.ds.args = ["serve-decryption", "--data-dir", str(workdir / "ds"), *dep._transport(DS_ID, "decryption"),
                       *(["--computation-id", CS_ID, "--operator-key", dep.approval[1].hex()] if secure else [])]
        dep.ds.start()
        try:
            dep.cs.args = ["serve-computation", "--data-dir", str(workdir / "cs"), "--decryption", dep.ds.target,
                           *dep._transport(CS_ID, "computation")]
            dep.cs.start()
        except BaseException:
            dep.ds.stop()
            raise
        return dep

    def _transport(self, party: str, role: str) -> list[str]:
        tls = self.tls(party, role)
        if tls is None:
            return ["--insecure"]
        return ["--ca-cert", str(tls.ca_cert), "--cert", str(tls.cert), "--key", str(tls.key)]

    def tls(self, party: str, role: str) -> TlsConfig | None:
        if self.certs is None:
            return None
        if party not in self.issued:
            issue_party_certificate(self.ca, self.certs, party, role)
            self.issued.add(party)
        return TlsConfig.in_directory(self.certs, party)

    def computation(self, party: str = OPERATOR_ID, role: str = "operator", **kw: Any) -> ComputationClient:
        return ComputationClient(self.cs.target, tls=self.tls(party, role), insecure=self.certs is None,
                                 approval_key=self.approval[0], **kw)

    def decryption(self, party: str = OPERATOR_ID, role: str = "operator", **kw: Any) -> DecryptionClient:
        return DecryptionClient(self.ds.target, tls=self.tls(party, role), insecure=self.certs is None, **kw)

    def analyst(self, party: str, **kw: Any) -> AnalystClient:
        return AnalystClient(self.cs.target, tls=self.tls(party, "analyst"), insecure=self.certs is None, **kw)

    def signing_key(self, owner_id: str) -> tuple[bytes, bytes]:
        """(private, public) Ed25519 key of a data owner (a secure server accepts signed studies only)."""
        if owner_id not in self.signing:
            self.signing[owner_id] = generate_signing_key()
        return self.signing[owner_id]

    def open_study(self, op: ComputationClient, study_id: str, bins: int, epsilon: float) -> None:
        keys = {OWNER_ID: self.signing_key(OWNER_ID)[1]} if self.certs is not None else None
        op.open_study(study_id=study_id, domain_size=bins, epsilon=epsilon, expected_owners=[OWNER_ID],
                      strategy=self.strategy, owner_keys=keys)

    def owner(self, owner_id: str = OWNER_ID, **kw: Any) -> DataOwnerClient:
        key = self.signing_key(owner_id)[0] if self.certs is not None else None
        return DataOwnerClient(owner_id, computation=self.cs.target, decryption=self.ds.target, progress=False,
                               tls=self.tls(owner_id, "data_owner"), insecure=self.certs is None, signing_key=key,
                               **kw)

    def stop(self) -> None:
        self.cs.stop()
        self.ds.stop()


@dataclass
class Loaded:
    """A deployment with a few finished releases: `large` (of `large_bins` bins) and small ones."""

    dep: Deployment
    large: str
    small: list[str]
    upload_key: str
    setup_s: float


def publish(dep: Deployment, large_bins: int) -> Loaded:
    t0 = time.monotonic()
    with dep.computation(timeout=600.0) as op, dep.owner(timeout=600.0) as owner:
        op.wait_ready()
        dep.open_study(op, "small", SMALL_BINS, 2.0)
        dep.open_study(op, "large", large_bins, 2.0)
        rng = np.random.default_rng(7)
        owner.submit("small", rng.poisson(4.0, SMALL_BINS), idempotency_key="small-1")
        res = owner.submit("large", rng.poisson(2.0, large_bins), idempotency_key="large-1")
        small = [op.run_release("small", epsilon=0.5, timeout=600).release_id for _ in range(2)]
        large = op.run_release("large", epsilon=1.0, timeout=600).release_id
    return Loaded(dep, large, small, res.idempotency_key, time.monotonic() - t0)


def _ranges(count: int, domain: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, domain - 1, count)
    width = rng.integers(1, max(2, domain // 4), count)
    return [(int(a), int(min(domain, a + w))) for a, w in zip(lo, width)]


def _classify(exc: BaseException) -> str:
    if isinstance(exc, ServiceError):
        if exc.code == grpc.StatusCode.UNAVAILABLE and "server busy" in exc.details:
            return "busy"
        return str(exc.code.name)
    return type(exc).__name__


def starvation(loaded: Loaded, *, duration: float, threads: int, ranges: int, deadline: float,
               large_bins: int) -> dict[str, Any]:
    dep = loaded.dep
    stop = threading.Event()
    outcomes: dict[str, dict[str, int]] = {}
    lock = threading.Lock()

    def note(who: str, what: str) -> None:
        with lock:
            outcomes.setdefault(who, {}).setdefault(what, 0)
            outcomes[who][what] += 1

    batch = _ranges(ranges, large_bins, 3)

    def hammer(client: AnalystClient, who: str, index: int) -> None:
        i = index
        while not stop.is_set():
            i += 1
            try:
                if i % 2:
                    client.list_releases(timeout=deadline)
                    note(who, "ListReleases ok")
                else:
                    client.range_counts(loaded.large, batch, timeout=deadline)
                    note(who, "RangeCounts ok")
            except Exception as exc:  # counted, then the next call
                note(who, f"{'ListReleases' if i % 2 else 'RangeCounts'} {_classify(exc)}")

    def poll(call: Callable[[], object], who: str, samples: list[float], refused: list[str]) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                call()
                samples.append(time.monotonic() - t0)
            except Exception as exc:
                refused.append(_classify(exc))
            stop.wait(max(0.0, 0.2 - (time.monotonic() - t0)))

    op_lat: list[float] = []
    op_bad: list[str] = []
    own_lat: list[float] = []
    own_bad: list[str] = []
    with ExitStack() as stack:
        analysts = [stack.enter_context(dep.analyst(f"analyst-{k}", retry=ONCE)) for k in (1, 2)]
        op = stack.enter_context(dep.computation(retry=ONCE))
        owner = stack.enter_context(dep.computation(OWNER_ID, "data_owner", retry=ONCE))
        workers = [threading.Thread(target=hammer, args=(a, f"analyst-{k + 1}", t), daemon=True)
                   for k, a in enumerate(analysts) for t in range(threads)]
        workers += [
            threading.Thread(target=poll, args=(lambda: op.study_status("large", timeout=5.0), "operator", op_lat,
                                                op_bad), daemon=True),
            threading.Thread(target=poll, args=(lambda: owner.upload_status("large", OWNER_ID, loaded.upload_key,
                                                                             timeout=5.0),
                                                "owner", own_lat, own_bad), daemon=True),
        ]
        for w in workers:
            w.start()
        stop.wait(duration)
        stop.set()
        for w in workers:
            w.join(deadline + 10)
    operator: dict[str, Any] = {**quantiles(op_lat), "refused": len(op_bad), "refusals": sorted(set(op_bad))}
    owner_q: dict[str, Any] = {**quantiles(own_lat), "refused": len(own_bad), "refusals": sorted(set(own_bad))}
    ok = all(q["refused"] == 0 and q["max_s"] is not None and q["max_s"] <= 1.0 for q in (operator, owner_q))
    result = {"duration_s": duration, "threads_per_analyst": threads, "ranges_per_query": ranges,
              "analyst_deadline_s": deadline, "large_bins": large_bins, "operator_study_status": operator,
              "owner_upload_status": owner_q, "analyst_calls": outcomes, "acceptance_within_1s": ok}
    print(f"[starvation] {duration:.0f} s, 2 analysts x {threads} threads (ListReleases + RangeCounts of {ranges} "
          f"ranges on {large_bins} bins, deadline {deadline} s)")
    for name, q in (("operator StudyStatus", operator), ("owner UploadStatus", owner_q)):
        print(f"  {name}: {q['calls']} answered, p50 {q['p50_s']} s, p99 {q['p99_s']} s, max {q['max_s']} s, "
              f"refused {q['refused']} {q['refusals'] or ''}")
    for who, counts in sorted(outcomes.items()):
        print(f"  {who}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"  acceptance (operator and owner answered, all within 1 s): {'PASS' if ok else 'FAIL'}")
    return result


def oversized(workdir: Path, *, count: int, mib: float) -> dict[str, Any]:
    cs = Server("cs-oversized", ["serve-computation", "--data-dir", str(workdir / "cs-oversized"), "--decryption",
                                 "127.0.0.1:1", "--insecure"], workdir)
    cs.start()
    try:
        assert cs.proc is not None
        one = b"\x12\x04\x08\x01\x10\x02"  # one Range(lo=1, hi=2) field of a RangeCountsRequest
        big = b"\x0a\x03rel" + one * int(mib * 2**20 / len(one))
        ch = grpc.insecure_channel(cs.target, options=list(GRPC_OPTIONS))
        try:
            grpc.channel_ready_future(ch).result(timeout=30)
            before = vm_hwm_mb(cs.proc.pid)
            call = ch.unary_unary("/dpagg.v1.Analyst/RangeCounts")
            t0 = time.monotonic()
            futures = [call.future(big, timeout=120) for _ in range(count)]
            errors = [f.exception() for f in futures]
            seconds = time.monotonic() - t0
            after = vm_hwm_mb(cs.proc.pid)
            codes = [e.code().name if isinstance(e, grpc.RpcError) else "OK" for e in errors]
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            serving = health.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            ch.close()
    finally:
        cs.stop()
    refused = codes.count("RESOURCE_EXHAUSTED")
    result = {"requests": count, "request_mib": round(len(big) / 2**20, 1), "refused_resource_exhausted": refused,
              "codes": sorted(set(codes)), "seconds": round(seconds, 3), "cs_peak_rss_mb_before": round(before, 1),
              "cs_peak_rss_mb_after": round(after, 1), "health_serving_after": serving,
              "ok": refused == count and serving}
    print(f"[oversized] {count} x {len(big) / 2**20:.1f} MiB RangeCounts: {refused}/{count} RESOURCE_EXHAUSTED in "
          f"{seconds:.2f} s; CS peak RSS {before:.0f} MB before, {after:.0f} MB after; health "
          f"{'SERVING' if serving else 'NOT SERVING'}")
    return result


def _busy_round(dep: Deployment, release_id: str, batch: list[tuple[int, int]], policy: RetryPolicy, *,
                clients: int, calls: int, deadline: float) -> tuple[list[float], list[str], float]:
    """`clients` analysts (one certificate each) start together and run `calls` RangeCounts each."""
    done: list[float] = []
    failed: list[str] = []
    lock = threading.Lock()
    go = threading.Event()

    def client_run(k: int) -> None:
        with dep.analyst(f"busy-{k}", retry=policy) as a:
            go.wait()
            for _ in range(calls):
                t0 = time.monotonic()
                try:
                    a.range_counts(release_id, batch, timeout=deadline)
                    with lock:
                        done.append(time.monotonic() - t0)
                except Exception as exc:
                    with lock:
                        failed.append(_classify(exc))

    threads = [threading.Thread(target=client_run, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # channels up
    t0 = time.monotonic()
    go.set()
    for t in threads:
        t.join(calls * deadline + 30)
    return done, failed, time.monotonic() - t0


def busy(loaded: Loaded, *, clients: int, ranges: int, calls: int, deadline: float, large: bool,
         large_bins: int) -> dict[str, Any]:
    bins = large_bins if large else SMALL_BINS
    release_id = loaded.large if large else loaded.small[0]
    batch = _ranges(ranges, bins, 5)
    out: dict[str, Any] = {"clients": clients, "calls_each": calls, "ranges_per_call": ranges, "bins": bins,
                           "deadline_s": deadline}
    total = clients * calls
    for label, policy in (("sdk_retry", RetryPolicy()), ("one_attempt", ONCE)):
        done, failed, wall = _busy_round(loaded.dep, release_id, batch, policy, clients=clients, calls=calls,
                                         deadline=deadline)
        out[label] = {"succeeded": len(done), "failed": len(failed), "failures": sorted(set(failed)),
                      "failed_share": round(len(failed) / total, 3), "wall_s": round(wall, 2),
                      "latency": quantiles(done)}
        print(f"[busy] {clients} clients x {calls} RangeCounts of {ranges} ranges on {bins} bins ({label}, deadline "
              f"{deadline} s): "
              f"{len(done)} succeeded, {len(failed)} failed ({100 * len(failed) / total:.0f}%) "
              f"{sorted(set(failed)) or ''}; p50 {out[label]['latency']['p50_s']} s, "
              f"max {out[label]['latency']['max_s']} s, wall {wall:.1f} s")
    return out


def _wait_state(op: ComputationClient, release_id: str, timeout: float) -> tuple[str, str]:
    end = time.monotonic() + timeout
    state, why = "RUNNING", ""
    while time.monotonic() < end:
        try:
            st = op.release_status(release_id, timeout=5.0)
            state, why = st.state, f"{st.error_code} {st.error_message}".strip()
            if state != "RUNNING":
                break
        except ServiceError as exc:
            why = f"{exc.code.name}: {exc.details}"
        time.sleep(0.2)
    return state, why


def kill_once(workdir: Path, victim: str, bins: int, timeout: float, strategy: str) -> dict[str, Any]:
    dep = Deployment.start(workdir, secure=False, strategy=strategy)
    try:
        total = 1.0
        with dep.computation(timeout=120.0) as op, dep.owner(timeout=300.0) as owner, \
                dep.decryption(timeout=10.0) as ledger:
            op.wait_ready()
            dep.open_study(op, "k", bins, total)
            owner.submit("k", np.random.default_rng(11).poisson(3.0, bins), idempotency_key="k-1")
            first = op.run_release("k", epsilon=0.6, wait=False, timeout=30.0).release_id
            end = time.monotonic() + timeout
            while ledger.budget("k").spent <= 0 and time.monotonic() < end:  # charged: the release is under way
                time.sleep(0.02)
            charged_before_kill = ledger.budget("k").spent
            server = dep.ds if victim == "ds" else dep.cs
            assert server.proc is not None
            server.proc.kill()  # SIGKILL: no shutdown code runs
            server.proc.wait(10)
            killed_at = time.monotonic()
            time.sleep(1.0)  # down for a moment, as a crash and a supervisor's restart would be
            restart_at = time.monotonic()
            server.start()
            with (dep.decryption if victim == "ds" else dep.computation)(timeout=10.0) as probe:
                probe.wait_ready(timeout=timeout)
            serving_s = time.monotonic() - restart_at
            state, why = _wait_state(op, first, timeout)
            interrupted_s = time.monotonic() - restart_at
            spent_after_crash = ledger.budget("k").spent
            rerun_state, rerun_why = "", ""
            try:
                rerun = op.run_release("k", epsilon="rest", timeout=timeout)
                rerun_state = rerun.state
            except ServiceError as exc:
                rerun_state, rerun_why = "FAILED", f"{exc.code.name}: {exc.details}"
            recovered_s = time.monotonic() - restart_at
            budget = ledger.budget("k")
            rows = [c.epsilon for c in budget.charges if c.release_id == first]
    finally:
        dep.stop()
    result = {"victim": victim, "bins": bins, "budget_total": total, "charged_before_kill": charged_before_kill,
              "interrupted_release_charges": rows,
              "interrupted_release": {"state": state, "why": why[:300]},
              "spent_after_crash": spent_after_crash, "rerun_rest": {"state": rerun_state, "why": rerun_why[:300]},
              "spent_final": budget.spent, "reserved_final": budget.reserved,
              "overspent": budget.spent > budget.total + 1e-9,
              "down_s": round(restart_at - killed_at, 2), "restart_to_serving_s": round(serving_s, 2),
              "restart_to_interrupted_release_settled_s": round(interrupted_s, 2),
              "restart_to_rerun_done_s": round(recovered_s, 2),
              "ok": budget.spent <= budget.total + 1e-9 and state in ("FAILED", "DONE") and rerun_state == "DONE"}
    print(f"[kill -9 {victim}] mid-release ({bins} bins, charged {charged_before_kill} of {total}): interrupted "
          f"release {state} ({why[:200]}), its ledger rows {[round(e, 4) for e in rows]}; spent "
          f"{spent_after_crash:.4g} after the crash, {budget.spent:.4g} of {budget.total} (reserved "
          f"{budget.reserved:.4g}) after re-running the rest ({rerun_state} {rerun_why[:120]}); restart -> SERVING "
          f"{serving_s:.2f} s, -> rerun done {recovered_s:.2f} s; overspent: {result['overspent']}")
    return result


def sigterm(loaded: Loaded, *, ranges: int, large_bins: int, limit: float) -> dict[str, Any]:
    dep = loaded.dep
    batch = _ranges(ranges, large_bins, 9)
    stop = threading.Event()
    futures: list[Any] = []
    with ExitStack() as stack:
        channels = []
        for k in range(3):
            tls = dep.tls(f"term-{k}", "analyst")
            assert tls is not None
            ch = grpc.secure_channel(dep.cs.target, tls.channel_credentials(),
                                     options=[*GRPC_OPTIONS,
                                              ("grpc.ssl_target_name_override", "computation.dpagg")])
            stack.callback(ch.close)
            channels.append(ch)
        req = analyst_pb2.RangeCountsRequest(release_id=loaded.large,
                                             ranges=[common_pb2.Range(lo=a, hi=b) for a, b in batch])
        for ch in channels:
            call = ch.unary_unary("/dpagg.v1.Analyst/RangeCounts",
                                  request_serializer=analyst_pb2.RangeCountsRequest.SerializeToString)
            futures += [call.future(req, timeout=120) for _ in range(2)]
        otls = dep.tls(OWNER_ID, "data_owner")
        assert otls is not None
        och = grpc.secure_channel(dep.cs.target, otls.channel_credentials(),
                                  options=[*GRPC_OPTIONS, ("grpc.ssl_target_name_override", "computation.dpagg")])
        stack.callback(och.close)

        def silent() -> Iterator[bytes]:
            stop.wait()
            return
            yield b""  # pragma: no cover

        futures.append(och.stream_unary("/dpagg.v1.Computation/SubmitHistogram").future(silent(), timeout=120))
        stack.callback(stop.set)
        time.sleep(0.5)  # the calls reach the server
        in_flight = sum(not f.done() for f in futures)
        assert dep.cs.proc is not None
        t0 = time.monotonic()
        dep.cs.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = dep.cs.proc.wait(limit)
        except subprocess.TimeoutExpired:
            code = None
        exited_s = time.monotonic() - t0
        for f in futures:
            f.cancel()
    result = {"calls_in_flight": in_flight, "exit_s": round(exited_s, 2), "exit_code": code,
              "limit_s": limit, "ok": code is not None}
    print(f"[sigterm] computation server with {in_flight} calls in flight (RangeCounts of {ranges} ranges, a silent "
          f"upload stream): exited {'with code ' + str(code) if code is not None else 'NOT'} "
          f"{exited_s:.2f} s after SIGTERM")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios of {', '.join(SCENARIOS)}")
    ap.add_argument("--large-bins", type=int, default=1 << 20, help="bins of the large release (default 2^20)")
    ap.add_argument("--strategy", default="auto",
                    help="the studies' strategy (default auto; RangeCounts on a 'hier' release cost O(bins) per range)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of starvation load (default 20)")
    ap.add_argument("--threads", type=int, default=4, help="threads per analyst in the starvation run (default 4)")
    ap.add_argument("--ranges", type=int, default=1000, help="ranges per heavy RangeCounts (default 1,000)")
    ap.add_argument("--deadline", type=float, default=2.0, help="the analysts' deadline per call, s (default 2)")
    ap.add_argument("--oversized", type=int, default=8, help="oversized requests (default 8)")
    ap.add_argument("--oversized-mib", type=float, default=57.0, help="size of each, MiB (default 57)")
    ap.add_argument("--clients", type=int, default=10, help="concurrent SDK clients in the busy run (default 10)")
    ap.add_argument("--busy-calls", type=int, default=2, help="RangeCounts per client in the busy run (default 2)")
    ap.add_argument("--busy-large", action="store_true",
                    help="ask the large release in the busy run (default: a 4,096-bin one, whose ranges can answer)")
    ap.add_argument("--busy-deadline", type=float, default=20.0, help="their deadline, s (default 20)")
    ap.add_argument("--kill", default="ds,cs", help="servers to kill -9 mid-release, in turn (default ds,cs)")
    ap.add_argument("--kill-bins", type=int, default=1 << 17, help="bins of the killed release (default 2^17)")
    ap.add_argument("--sigterm-limit", type=float, default=30.0, help="give up waiting after SIGTERM, s (default 30)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and logs here (default: a temp dir)")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/reliability.json")
    args = ap.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")

    # SIGTERM to this script unwinds like an exception, so the servers it started are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {"scenarios": chosen}
    started = time.monotonic()
    with ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpagg-reliability-")))
        else:
            workdir = args.workdir.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        loaded: Loaded | None = None
        if {"starvation", "busy", "sigterm"} & set(chosen):
            dep = Deployment.start(workdir / "tls", secure=True, strategy=args.strategy)
            stack.callback(dep.stop)  # runs on failure too
            loaded = publish(dep, args.large_bins)
            results["setup"] = {"large_bins": args.large_bins, "strategy": args.strategy, "seconds": round(loaded.setup_s, 2)}
            print(f"[setup] mutual TLS; 3 releases (one of {args.large_bins} bins) published in {loaded.setup_s:.1f} s")
        if "starvation" in chosen:
            assert loaded is not None
            results["starvation"] = starvation(loaded, duration=args.duration, threads=args.threads,
                                               ranges=args.ranges, deadline=args.deadline, large_bins=args.large_bins)
        if "oversized" in chosen:
            results["oversized"] = oversized(workdir, count=args.oversized, mib=args.oversized_mib)
        if "busy" in chosen:
            assert loaded is not None
            results["busy"] = busy(loaded, clients=args.clients, ranges=args.ranges, calls=args.busy_calls,
                                   deadline=args.busy_deadline, large=args.busy_large, large_bins=args.large_bins)
        if "sigterm" in chosen:
            assert loaded is not None
            results["sigterm"] = sigterm(loaded, ranges=args.ranges * 100, large_bins=args.large_bins,
                                         limit=args.sigterm_limit)
        if "kill" in chosen:
            results["kill"] = [kill_once(workdir / f"kill-{v}", v.strip(), args.kill_bins, timeout=120.0,
                                         strategy=args.strategy)
                               for v in args.kill.split(",") if v.strip()]
    results["wall_s"] = round(time.monotonic() - started, 1)
    print(f"total {results['wall_s']} s")
    if not args.no_write:
        print(f"wrote {write_result('reliability', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
