"""`dpagg demo`: every party on loopback, three data owners on generated data, one release, queries."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .analyst.client import AnalystClient
from .common.config import ComputationConfig, DecryptionConfig
from .common.progress import QUIET, Progress
from .common.signing import generate_signing_key
from .common.tls import TlsConfig
from .common.pki import create_ca, issue_party_certificate
from .computation.client import ComputationClient
from .computation.server import create_computation_server
from .data_owner.client import DataOwnerClient
from .decryption.client import DecryptionClient
from .decryption.server import create_decryption_server

__all__ = ["run_demo", "format_demo", "plot_demo", "plot_bands", "partition_boundaries"]

log = logging.getLogger("dpagg.demo")


def _ranges(n: int) -> list[tuple[int, int]]:
    """A few readable ranges: the whole domain and its four quarters."""
    q = [0, n // 4, n // 2, (3 * n) // 4, n]
    return [(0, n)] + [(q[i], q[i + 1]) for i in range(4) if q[i] < q[i + 1]]


def _demo_pki(directory: Path, owner_ids: list[str]) -> dict[str, TlsConfig]:
    """A throwaway private CA and one certificate per demo party (keys 0600, in `directory`)."""
    ca = create_ca(directory)
    parties = {"decryption": "decryption", "computation": "computation", "operator": "operator",
               "analyst": "analyst", **{o: "data_owner" for o in owner_ids}}
    out = {}
    for party_id, role in parties.items():
        issue_party_certificate(ca, directory, party_id, role)
        out[party_id] = TlsConfig.in_directory(directory, party_id)
    return out


def run_demo(*, owners: int = 3, records: int = 3000, domain: str = "age:0:100:100", epsilon: float = 1.0,
             seed: int = 7, data_dir: Path | None = None, noise_seed: int | None = None,
             tls: bool = True, progress: Progress = QUIET) -> dict[str, Any]:
    """Run a complete study in this process and return what the demo prints (as plain JSON types).

    Servers listen on 127.0.0.1, port 0; state goes to `data_dir` (a temporary directory by
    default, removed afterwards). With `tls` (the default) every party talks mutual TLS
    with a certificate from a throwaway CA created in that directory, so the servers check
    every caller's role exactly as in a deployment, and the study is signed: each owner
    gets an Ed25519 key whose public half goes into the contract, signs its upload, and
    the release lists the owners' signatures. `tls=False` runs everything insecure. The
    owners' records are synthetic (seeded), each person contributes at most one record
    (person column ``person_id``), so the release is `epsilon`-DP per person; noise comes
    from the OS CSPRNG unless `noise_seed` is given. `progress` reports each step as it
    starts (servers, each owner's binning, encryption and upload, the release).
    """
    from .data_owner.dataset import ContributionBounds, read_histogram, write_sample_csv
    from .data_owner.domain import DomainSpec

    t0 = time.monotonic()
    spec = DomainSpec.parse(domain)
    bounds = ContributionBounds(per_bin=1, max_bins=1)
    owner_ids = [f"owner-{i + 1}" for i in range(owners)]
    with tempfile.TemporaryDirectory(prefix="dpagg-demo-") as tmp:
        root = Path(data_dir) if data_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        progress.say(f"dpagg demo: {owners} data owners, domain {domain} ({spec.n_bins:,} bins), epsilon {epsilon:g}")
        with progress.step("starting the decryption and computation servers" + (" (mutual TLS)" if tls else "")):
            pki = _demo_pki(root / "pki", owner_ids) if tls else {}
            signing = {o: generate_signing_key() for o in owner_ids} if tls else {}
            approval = generate_signing_key() if tls else None  # the operator's study approval key
            ds = create_decryption_server(DecryptionConfig(root / "decryption", noise_seed=noise_seed,
                                                           tls=pki.get("decryption"), insecure=not tls,
                                                           operator_keys=(approval[1],) if approval else ())).start()
            cs = create_computation_server(ComputationConfig(
                root / "computation", ds.target, noise_seed=None if noise_seed is None else noise_seed + 1,
                tls=pki.get("computation"), insecure=not tls)).start()
        try:
            with ComputationClient(cs.target, tls=pki.get("operator"), insecure=not tls,
                                   approval_key=approval[0] if approval else None) as operator, \
                    DecryptionClient(ds.target, tls=pki.get("operator"), insecure=not tls) as key_holder, \
                    AnalystClient(cs.target, tls=pki.get("analyst"), insecure=not tls) as analyst:
                with progress.step("opening the study (the decryption server makes its BFV key)"):
                    operator.wait_ready()
                    contract, _ = operator.open_study(
                        domain_size=spec.n_bins, epsilon=epsilon, expected_owners=owner_ids,
                        contribution_bound=bounds.contribution_bound, domain_spec=domain,
                        owner_keys={o: pub for o, (_, pub) in signing.items()} or None)
                truth = np.zeros(spec.n_bins, dtype=np.int64)
                uploads = []
                for i, owner in enumerate(owner_ids):
                    csv_path = root / f"{owner}.csv"
                    with progress.step(f"{owner}: generating and binning {records:,} records"):
                        write_sample_csv(csv_path, seed=seed, n_records=records, owner_index=i)
                        hist = read_histogram(csv_path, spec, person_column="person_id", bounds=bounds,
                                              rng=seed + i)
                    truth += hist.counts
                    with DataOwnerClient(owner, computation=cs.target, decryption=ds.target, tls=pki.get(owner),
                                         insecure=not tls, signing_key=signing[owner][0] if signing else None,
                                         progress=progress) as do:
                        res = do.submit(contract.study_id, hist)
                    uploads.append({"owner": owner, "records_read": hist.records_read,
                                    "records_kept": hist.total, "bytes_sent": res.bytes_sent})
                started = operator.run_release(contract.study_id, wait=False)
                with progress.step(f"release {started.release_id}: aggregating, noising and decrypting") as tick:
                    release = operator.wait_release(started.release_id, on_poll=lambda _: tick(0))
                with progress.step("analyst: reading the release, checking its signatures, range counts"):
                    got = analyst.get_release(release.release_id)
                    for sig in got.signatures:  # anyone holding the contract can check whose data is in it
                        key = contract.owner_public_key(sig.owner_id)
                        assert key is not None
                        sig.verify(key, study_id=contract.study_id, contract_hash=contract.contract_hash)
                    summary = got.summary
                    ranges = _ranges(spec.n_bins)
                    counts = analyst.range_counts(release.release_id, ranges)
                    budget = key_holder.budget(contract.study_id)
        finally:
            cs.stop()
            ds.stop()
    edges = [float(e) for e in spec.edges]
    return {
        "release_id": release.release_id,
        "study_id": contract.study_id,
        "contract_hash": contract.contract_hash,
        "tls": tls,
        "signed_by": [s.owner_id for s in got.signatures],
        "epsilon_total": budget.total,
        "epsilon_spent": budget.spent,
        "epsilon_left": budget.remaining,
        "epsilon_charges": [{"kind": c.kind, "epsilon": c.epsilon} for c in budget.charges],
        "noise_parties": summary.noise_parties,
        "contribution_bound": summary.contribution_bound,
        "domain": {"spec": domain, "column": spec.column, "n_bins": spec.n_bins, "edges": edges},
        "owners": uploads,
        "true_histogram": [int(v) for v in truth],
        "released_estimates": [float(v) for v in summary.estimate()],
        "partitions": {"starts": [int(s) for s in summary.starts], "sums": [int(s) for s in summary.sums],
                       "sum_variance": [float(v) for v in summary.sum_variance]},
        "range_counts": [
            {"lo": c.lo, "hi": c.hi, "label": f"{spec.column} in [{edges[c.lo]:g}, {edges[c.hi]:g})",
             "value": c.value, "standard_error": c.standard_error, "true": int(truth[c.lo:c.hi].sum())}
            for c in counts
        ],
        "seconds": round(time.monotonic() - t0, 3),
    }


def format_demo(result: dict[str, Any]) -> str:
    """The human-readable demo report."""
    d = result["domain"]
    lines = [
        f"released: {len(result['owners'])} data owners' records over {d['spec']} ({d['n_bins']:,} bins) at "
        f"epsilon {result['epsilon_total']:g}",
    ]
    for o in result["owners"]:
        lines.append(f"  {o['owner']}: {o['records_read']} records, {o['records_kept']} kept after bounding, "
                     f"{o['bytes_sent'] / 1e6:.2f} MB of ciphertext uploaded")
    parts = result["partitions"]
    signed = result.get("signed_by") or []
    lines += [
        f"release {result['release_id']} of study {result['study_id']}: {len(parts['starts'])} partitions, "
        f"{result['noise_parties']} noise parties, contribution bound {result['contribution_bound']}",
        ("parties talked mutual TLS; the release contains the signed submissions of " + ", ".join(signed))
        if result.get("tls") else "parties talked WITHOUT TLS (--insecure); submissions were not signed",
        "range counts (estimate +- 1 standard error of the DP noise; true count of the generated data):",
    ]
    for c in result["range_counts"]:
        lines.append(f"  {c['label']:<28} {c['value']:>10.1f} +- {c['standard_error']:<7.1f} (true {c['true']})")
    charges = ", ".join(f"{c['kind']} {c['epsilon']:g}" for c in result["epsilon_charges"])
    lines.append(f"budget: spent {result['epsilon_spent']:g} of {result['epsilon_total']:g}, "
                 f"left {result['epsilon_left']:g} ({charges})")
    lines.append(f"finished in {result['seconds']:.1f} s")
    return "\n".join(lines)


def plot_bands(result: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin: the released estimate and estimate -+ 1 standard error, all clipped at 0 (a count is never
    negative; noise can make an estimate so). A bin's standard error is its partition's noise spread evenly
    over the partition's bins (sqrt(variance) / length)."""
    est = np.asarray(result["released_estimates"], dtype=np.float64)
    parts = result["partitions"]
    starts = np.asarray(parts["starts"], dtype=np.int64)
    lengths = np.diff(np.append(starts, est.size))
    se = np.repeat(np.sqrt(np.asarray(parts["sum_variance"], dtype=np.float64)) / lengths, lengths)
    return np.maximum(est, 0.0), np.maximum(est - se, 0.0), np.maximum(est + se, 0.0)


#: Above this many partitions their boundaries are drawn as short ticks along the x axis, not full-height lines.
BOUNDARY_LINES_MAX = 60


def partition_boundaries(result: dict[str, Any]) -> np.ndarray:
    """The x positions (domain units: the bin edges) where one released partition ends and the next starts:
    the left edge of every partition but the first. Within a partition the released count is spread evenly,
    so the estimate is flat between two boundaries."""
    edges = np.asarray(result["domain"]["edges"], dtype=np.float64)
    starts = np.asarray(result["partitions"]["starts"], dtype=np.int64)
    return np.asarray(edges[starts[1:]], dtype=np.float64)


def plot_demo(result: dict[str, Any], path: Path) -> Path:
    """Write a PNG of the true histogram against the released per-bin estimates and their error band (needs
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError("--plot needs matplotlib: pip install 'dpagg[plot]'") from exc
    edges = np.asarray(result["domain"]["edges"])
    truth = np.asarray(result["true_histogram"])
    shown, low, high = plot_bands(result)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(edges[:-1], truth, width=np.diff(edges), align="edge", color="#9ecae1", label="true (generated data)")
    ax.fill_between(edges, np.append(low, low[-1]), np.append(high, high[-1]), step="post", color="#d62728",
                    alpha=0.2, linewidth=0, label="+- 1 standard error of the noise")
    ax.step(edges, np.append(shown, shown[-1]), where="post", color="#d62728", linewidth=1.5,
            label=f"released (epsilon {result['epsilon_spent']:g}; below 0 drawn at 0)")
    bounds = partition_boundaries(result)
    n_parts = len(result["partitions"]["starts"])
    if bounds.size:  # full-height lines while they stay readable, else ticks along the axis
        top = 1.0 if bounds.size <= BOUNDARY_LINES_MAX else 0.04
        ax.vlines(bounds, 0.0, top, transform=ax.get_xaxis_transform(), colors="#555555", linewidth=0.6,
                  linestyles=":" if top == 1.0 else "-", alpha=0.7,
                  label=f"partition boundaries ({n_parts} partitions: flat inside each)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(result["domain"]["column"])
    ax.set_ylabel("records per bin")
    ax.set_title(f"dpagg release {result['release_id']}: {len(result['partitions']['starts'])} partitions")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
