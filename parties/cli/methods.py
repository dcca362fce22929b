"""CLI subcommands for the methods around a release: epsilon guidance, audit, correlated data, accounting, p-views."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_parser", "load_matrix"]


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=float))


def _epsilon(args: argparse.Namespace) -> int:
    from he_partition.methods.guidance import assess_epsilon, epsilon_for_guessing_bound

    if args.alpha is not None:
        eps = epsilon_for_guessing_bound(args.alpha)
        if args.json:
            _print({"alpha": args.alpha, "epsilon": round(eps, 3), "epsilon_exact": eps})
        else:
            print(f"epsilon {eps:.3f} (exactly {eps!r}) is where an adversary who rounds the best unbiased estimate of "
                  f"one count is wrong with probability at most {args.alpha:g} (Chebyshev's bound at the smallest "
                  "variance epsilon-DP allows; a heuristic, not a guarantee against every adversary)")
        return 0
    a = assess_epsilon(args.eps)
    if args.json:
        _print({"epsilon": a.epsilon, "variance_lower_bound": a.variance_lower_bound,
                "std_lower_bound": a.std_lower_bound, "guessing_bound_alpha": a.guessing_bound,
                "guessing_bound_clipped": a.guessing_bound_clipped, "warnings": list(a.warnings)})
    else:
        print(f"epsilon {a.epsilon:g} (one record added or removed changes one count by 1):")
        print(f"  no unbiased estimate of a count can have variance below {a.variance_lower_bound:.4g} "
              f"(standard deviation {a.std_lower_bound:.4g}), whatever the mechanism;")
        if a.guessing_bound_is_vacuous:
            print(f"  the guessing bound {a.guessing_bound:.3g} is at least 1: no claim to have recovered a count "
                  "exactly can be supported at any level (strong protection of single counts)")
        else:
            print(f"  an adversary who rounds the best unbiased estimate of a count is wrong with probability at most "
                  f"{a.guessing_bound:.3g} (Chebyshev): a claim of exact recovery below that level can be denied; "
                  "smaller means weaker protection")
        print("  (--json for the numbers as JSON)")
    for w in a.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from he_partition.methods.audit import run_audit

    result = run_audit(args.eps, trials=args.trials, broken=args.broken, seed=args.seed)
    _print(result.to_dict())
    if result.violation:
        what = "the deliberately broken mechanism (--broken)" if args.broken else "the mechanism"
        print(f"VIOLATION: {what}: empirical lower bound {result.epsilon_lower_bound:.3f} exceeds epsilon {args.eps}",
              file=sys.stderr)
        return 1
    return 0


def load_matrix(path: str) -> np.ndarray:
    """A numeric matrix from .csv (comma-separated rows), .npy, or a JSON list of lists."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        return np.asarray(np.loadtxt(p, delimiter=",", dtype=np.float64, ndmin=2), dtype=np.float64)
    if p.suffix == ".npy":
        return np.asarray(np.load(p), dtype=np.float64)
    return np.asarray(json.loads(p.read_text()), dtype=np.float64)


def _bayes(args: argparse.Namespace) -> int:
    from he_partition.methods.bayesian import CorrelationModel

    model = CorrelationModel(load_matrix(args.adjacency), tau=args.tau)
    leak = model.leakage_coefficients()
    _print({"records": model.n, "tau": args.tau, "leakage": leak.tolist(), "max_leakage": float(leak.max()),
            "laplace_scale": model.laplace_scale(args.eps, args.sensitivity),
            "plain_dp_laplace_scale": args.sensitivity / args.eps})
    return 0


def _charge(args: argparse.Namespace) -> int:
    from he_partition.core.accounting import RangeQuery, charged_epsilon, overlap_graph_max_clique, sequential_epsilon
    from he_partition.core.measurements import PREFIX_MASK_EPSILON

    raw = json.loads(Path(args.queries).read_text())
    queries = [RangeQuery(tuple(q["lo"]), tuple(q["hi"]), float(q["epsilon"])) for q in raw]
    clique = overlap_graph_max_clique(queries)
    # What the services charge: each 1-D range [lo, hi) with lo > 0 also shows the decryption server the prefix
    # [0, lo) behind a mask at PREFIX_MASK_EPSILON (he_partition.core.measurements.RangeCount).
    masks = [RangeQuery((0,), (q.lo[0],), PREFIX_MASK_EPSILON) for q in queries if q.ndim == 1 and q.lo[0] > 0]
    served = overlap_graph_max_clique([*queries, *masks]).epsilon_exact
    _print({"queries": len(queries), "charged_epsilon": charged_epsilon(queries),
            "charged_epsilon_over_services": float(served), "prefix_mask_pieces": len(masks),
            "charged_epsilon_over_services_exact": f"{served.numerator}/{served.denominator}",
            "sequential_epsilon": sequential_epsilon(queries), "max_clique": list(clique.indices)})
    return 0


def _pview(args: argparse.Namespace) -> int:
    from he_partition.methods.pviews import build_pview

    counts = np.load(args.counts)
    # No seed: exact noise from AES-CTR under a fresh OS key (CipherRandom); a seed is for tests only.
    view = build_pview(counts, args.eps, args.seed)
    if args.out:
        np.save(args.out, view.estimate())
    _print({"shape": list(view.shape), "blocks": len(view.blocks), "epsilon": args.eps,
            "estimate_written_to": args.out})
    return 0


def _add(sub: "argparse._SubParsersAction[argparse.ArgumentParser]", name: str, text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=text, description=text)


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the method subcommands to the `dpagg` CLI."""
    p = _add(sub, "epsilon", "what an epsilon means: the variance floor of any unbiased estimate, an adversary's "
                              "guessing bound; or a target bound alpha -> epsilon")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--eps", "--epsilon", dest="eps", type=float, help="assess this epsilon")
    g.add_argument("--alpha", type=float, help="target guessing bound (e.g. 0.1) -> epsilon")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(func=_epsilon)

    p = _add(sub, "audit", "empirical DP audit: lower confidence bound on epsilon by hypothesis testing; exits 1 "
                           "when the bound exceeds the claimed epsilon (a violation)")
    p.add_argument("--eps", "--epsilon", dest="eps", type=float, default=1.0,
                   help="the epsilon the audited mechanism claims (default 1)")
    p.add_argument("--trials", type=int, default=20_000,
                   help="mechanism runs per neighbouring dataset (default 20000; more tightens the bound)")
    p.add_argument("--broken", action="store_true", help="audit a deliberately broken mechanism (noise scale halved)")
    p.add_argument("--seed", type=int, default=None,
                   help="for tests only (reproducible runs); default draws from the OS CSPRNG")
    p.set_defaults(func=_audit)

    p = _add(sub, "bayes-scale", "Laplace scale for Bayesian DP on correlated records (Gaussian correlation "
                                  "model of the records)")
    p.add_argument("--adjacency", required=True, help="weighted adjacency matrix (.csv, .npy or JSON list of lists)")
    p.add_argument("--eps", "--epsilon", dest="eps", type=float, required=True,
                   help="the Bayesian-DP epsilon to guarantee")
    p.add_argument("--sensitivity", type=float, default=1.0,
                   help="sensitivity of the query under one record's change (default 1: a count)")
    p.add_argument("--tau", type=float, default=0.0, help="prior precision tau of the Gaussian correlation model")
    p.set_defaults(func=_bayes)

    p = _add(sub, "charge", "epsilon charged for direct range queries: the heaviest overlap of the ranges "
                            "(max clique); "
                            "charged_epsilon_over_services adds the 2^-20 prefix masks the services add")
    p.add_argument("--queries", required=True, help='JSON list of {"lo": [...], "hi": [...], "epsilon": e}')
    p.set_defaults(func=_charge)

    p = _add(sub, "pview", "trusted-curator p-view (DP-Mondrian/HDPView) of a count tensor")
    p.add_argument("--counts", required=True, help="count tensor (.npy)")
    p.add_argument("--eps", "--epsilon", dest="eps", type=float, required=True,
                   help="epsilon of the whole view (split between the partitioning and the block counts)")
    p.add_argument("--out", help="write the estimated tensor here (.npy)")
    p.add_argument("--seed", type=int, default=None,
                   help="for tests only (reproducible noise); default draws from the OS CSPRNG")
    p.set_defaults(func=_pview)
