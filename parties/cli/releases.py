"""Releases and queries: run and inspect a release, query released summaries, direct range queries."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc

from he_partition.core.accounting import epsilon_left
from he_partition.core.errors import DPAggError
from he_partition.core.intervals import describe, value_interval

from ..common.config import ENV_ANALYST, ENV_COMPUTATION, default_target
from ..common.errors import ServiceError
from ..common.progress import Progress
from .options import (Subparsers, command_adder, computation_target, conn, print_json,
                      server_address, tls_args)
from ..analyst.value_ranges import resolve_ranges as resolve_value_ranges, summary_domain
from .ranges import CUT_NOTE, range_arg, range_label, resolve_ranges


def confidence_arg(text: str) -> float:
    """--confidence: a level strictly between 0 and 1 (0.95, not 95)."""
    try:
        level = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < level < 1.0:
        raise argparse.ArgumentTypeError(f"a confidence level is strictly between 0 and 1 (e.g. 0.95), got {text}")
    return level


def _print_release(st: Any, as_json: bool) -> None:
    if as_json:
        print_json({"release_id": st.release_id, "study_id": st.study_id, "state": st.state, "epsilon": st.epsilon,
                     "owners": list(st.owners), "error_code": st.error_code, "error_message": st.error_message,
                     "seconds": st.seconds, "summary": st.summary.to_dict() if st.summary else None,
                     "progress": vars(st.progress) if st.progress is not None else None})
        return
    print(f"release {st.release_id} of study {st.study_id}: {st.state}, epsilon {st.epsilon:g}, "
          f"owners {', '.join(st.owners)}")
    if st.state == "RUNNING" and st.progress is not None:
        print(f"  {release_progress_text(st.progress)}")
    if st.summary is not None:
        s = st.summary
        total = s.range_count(0, s.domain_size)  # the whole-domain answer `dpagg query` gives
        print(f"  {s.n_partitions} partitions over {s.domain_size} bins, total {total.value:,.1f} "
              f"+- {total.standard_error:.1f}, computed in {st.seconds:.2f} s")
        for note in s.params.get("holder_failover") or []:  # t-of-N: a participant lost, another set took over
            print(f"  {note}")
    if st.error_message:
        print(f"  {st.error_code}: {st.error_message}")


def release_progress_text(p: Any) -> str:
    """What a running release is doing, from its `ReleaseProgress` (None: a server that does not report it).

    Only counts the server reports and an estimate for the measurement in flight from its own
    chunk rate: a strategy chooses later measurements from released values, so the release's
    total is not known ahead and no overall percentage is shown.
    """
    if p is None:
        return "aggregating, noising and decrypting on the servers"
    if p.phase == "aggregating":
        return "summing the submissions"
    done = f"{p.measurements_done} measurement{'' if p.measurements_done == 1 else 's'} decrypted"
    if not p.measurement_kind:
        return f"{done}; choosing the next step from the released values"
    # The measurement in flight first (a terminal line is cut at its width), what is done last.
    current = f"measurement {p.measurements_done + 1} ({p.measurement_kind})"
    if not p.chunks_total:
        return f"{current}: computing; {done} before it"
    if p.chunks_sent >= p.chunks_total:
        return f"{current}: all {p.chunks_total:,} chunks sent, decrypting; {done} before it"
    where = f"{current}: {p.chunks_sent:,}/{p.chunks_total:,} chunks sent"
    if p.chunks_sent and p.measurement_seconds > 0:
        left = p.measurement_seconds / p.chunks_sent * (p.chunks_total - p.chunks_sent)
        where += f", about {left:.0f} s left in it"
    return f"{where}; {done} before it"


def _epsilon_or_rest(text: str) -> float | str:
    """--epsilon for a release: a number > 0 and finite, or the word `rest` (what is left of the budget)."""
    if text.strip().lower() == "rest":
        return "rest"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or the word 'rest', got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 and finite, got {text}; "
                                         "use `--epsilon rest` to spend what is left")
    return value


def _pending_path(args: argparse.Namespace) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{args.computation}-{args.study}")
    return Path(args.state_dir).expanduser() / "pending-releases" / f"{safe}.json"


#: After these the server may have started the release: the request key stays so a re-run attaches to it.
_MAYBE_STARTED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def _release_finished(cs: Any, release_id: str) -> bool:
    """True when the release is DONE or FAILED; False while it runs or the server cannot say."""
    try:
        return bool(cs.release_status(release_id).state != "RUNNING")
    except ServiceError:
        return False


def cmd_release_run(args: argparse.Namespace) -> int:
    """Start a release with a request key kept on disk until it finishes, so a re-run attaches to it."""
    from ..computation.client import ComputationClient

    pending = _pending_path(args)
    spec = str(args.epsilon)
    key = ""
    if pending.is_file():
        saved = json.loads(pending.read_text())
        if saved.get("epsilon") == spec:
            key = str(saved.get("request_key", ""))
    key = key or args.request_key or f"cli-{uuid.uuid4().hex[:16]}"
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(json.dumps({"request_key": key, "epsilon": spec, "study": args.study}))
    with ComputationClient(args.computation, **conn(args)) as cs:
        try:
            st = cs.run_release(args.study, epsilon=args.epsilon, force=args.force, wait=False, request_key=key)
        except (ServiceError, DPAggError) as exc:
            if getattr(exc, "code", None) not in _MAYBE_STARTED:  # refused: nothing to attach to on a re-run
                pending.unlink(missing_ok=True)
            raise
        if not args.json:
            said = "started" if st.state == "RUNNING" else f"already {st.state.lower()} (this request key ran before)"
            print(f"release {st.release_id} of study {args.study} {said} (request key {key})", flush=True)
        if not args.no_wait and st.state == "RUNNING":
            try:
                with Progress(enabled=not args.json).status(f"release {st.release_id}") as show:
                    st = cs.wait_release(st.release_id, on_poll=lambda s: show(release_progress_text(s.progress)))
            except KeyboardInterrupt:
                print(f"\ninterrupted: release {st.release_id} continues on the server; see `dpagg release status "
                      f"{st.release_id}`, or re-run this command to attach to it (it spends nothing again)",
                      file=sys.stderr)
                return 130
            except ServiceError:
                if _release_finished(cs, st.release_id):  # keep the key while the release may still run
                    pending.unlink(missing_ok=True)
                raise
    if st.state != "RUNNING":
        pending.unlink(missing_ok=True)
    _print_release(st, args.json)
    return 0


def cmd_release_status(args: argparse.Namespace) -> int:
    from ..computation.client import ComputationClient

    with ComputationClient(args.computation, **conn(args)) as cs:
        st = cs.release_status(args.release)
    _print_release(st, args.json)
    return 0 if st.state != "FAILED" else 1


def cmd_query(args: argparse.Namespace) -> int:
    from ..analyst.client import AnalystClient

    with AnalystClient(args.analyst, **conn(args)) as an:
        if args.list or not args.release:
            infos = an.list_releases(args.study or "")
            if args.json:
                print_json([vars(i) for i in infos])
            else:
                for i in infos:
                    print(f"{i.release_id}  study {i.study_id}  epsilon {i.epsilon:g}  {i.domain_size} bins  "
                          f"{i.partitions} partitions  {i.created_at}")
                if not infos and args.study:
                    from ..computation.client import ComputationClient

                    try:
                        with ComputationClient(args.analyst, **conn(args)) as cs:
                            cs.study_status(args.study)
                    except ServiceError as exc:
                        if exc.code == grpc.StatusCode.NOT_FOUND:
                            print(f"dpagg: unknown study {args.study!r}: no such study on {args.analyst}",
                                  file=sys.stderr)
                            return 1
                    print(f"no finished releases of study {args.study} yet")
                elif not infos:
                    print("no finished releases")
            return 0
        release_id = args.release
        if release_id == "latest":
            if not args.study:
                raise DPAggError("`dpagg query latest` needs --study: the newest finished release of which study?")
            newest = max(an.list_releases(args.study), key=lambda i: i.created_at, default=None)
            if newest is None:
                raise DPAggError(f"study {args.study} has no finished release yet")
            release_id = newest.release_id
        rel = an.get_release(release_id)
        domain = summary_domain(rel.summary) or _release_domain(args, rel.study_id)
        ranges = resolve_value_ranges(args.range, domain, f"release {release_id} of study {rel.study_id}") \
            if args.range else [(0, rel.summary.domain_size)]
        counts = an.range_counts(release_id, ranges)
    answers = [{**c.as_dict(), "label": range_label(c.lo, c.hi, domain),
                "cuts_partition": rel.summary.cuts_partition(c.lo, c.hi)} for c in counts]
    if args.confidence is not None:
        for a in answers:  # computed here from the summary's noise: post-processing, no budget
            ci = rel.summary.interval(a["lo"], a["hi"], args.confidence)
            a.update(ci_lo=ci.lo, ci_hi=ci.hi, confidence=ci.confidence, interval_method=ci.method)
    if args.csv:
        _print_csv(answers, interval=args.confidence is not None)
        return 0
    if args.json:
        out: dict[str, Any] = {"release_id": rel.release_id, "study_id": rel.study_id, "range_counts": answers}
        if args.show:
            out["summary"] = rel.summary.to_dict()
            out["estimates"] = [float(v) for v in rel.summary.estimate()]
        from ..analyst.join_table import join_table_json

        if (table := join_table_json(rel.summary)) is not None:
            out["join_table"] = table
        print_json(out)
        return 0
    if args.show:
        s = rel.summary
        print(f"release {rel.release_id} of study {rel.study_id}: {s.n_partitions} partitions, epsilon {s.epsilon:g}")
        bdp = s.params.get("bayesian_dp")
        if isinstance(bdp, dict):
            print(f"  correlated records: {bdp.get('epsilon', 0):g}-Bayesian-DP (noise calibrated at DP epsilon "
                  f"{bdp.get('dp_epsilon', 0):g}, multiplier {bdp.get('noise_multiplier', 1):g})")
        for start, length, total in zip(s.starts, s.lengths, s.sums):
            print(f"  bins [{start}, {start + length}): {total}")
    else:
        print(f"release {rel.release_id} of study {rel.study_id} (epsilon {rel.summary.epsilon:g}):")
    if rel.summary.params.get("join") is not None and (args.table or not args.range):
        from ..analyst.join_table import join_table_lines

        print("\n".join(join_table_lines(rel.summary)))
        return 0
    for a in answers:
        print(f"{a['label']}: {a['value']:.1f} +- {a['standard_error']:.1f}{_interval_text(a)}"
              f"{' *' if a['cuts_partition'] else ''}")
    if args.confidence is not None:
        print(f"{_interval_heading(args.confidence)}: {describe(args.confidence)}")
    if any(a["cuts_partition"] for a in answers):
        print(CUT_NOTE)
    return 0


def _interval_heading(confidence: float) -> str:
    return f"[lo, hi] = {100.0 * confidence:g}% confidence interval"


def _interval_text(a: dict[str, Any]) -> str:
    """' [lo, hi]' when the answer carries a confidence interval, else ''."""
    if a.get("ci_lo") is None:
        return ""
    method = f" {a['interval_method']}" if a.get("interval_method") else ""
    return f" [{a['ci_lo']:.1f}, {a['ci_hi']:.1f}]{method}"


def _print_csv(answers: list[dict[str, Any]], *, interval: bool = False) -> None:
    """Range answers as CSV on stdout (header lo,hi,label,value,standard_error,cuts_partition; with `interval`
    also ci_lo,ci_hi,confidence,interval_method)."""
    import csv

    fields = ["lo", "hi", "label", "value", "standard_error", "cuts_partition"]
    if interval:
        fields += ["ci_lo", "ci_hi", "confidence", "interval_method"]
    writer = csv.DictWriter(sys.stdout, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(answers)


def _release_domain(args: argparse.Namespace, study_id: str) -> Any:
    """The study's DomainSpec (to print ranges in the domain's values), or None when unknown or unreadable."""
    from ..computation.client import ComputationClient
    from ..data_owner.domain import DomainSpec

    try:
        with ComputationClient(args.analyst, **conn(args)) as cs:
            spec = cs.study_status(study_id).contract.domain_spec
        return DomainSpec.parse(spec) if spec else None
    except (ServiceError, DPAggError, ValueError):
        return None


def cmd_direct_query(args: argparse.Namespace) -> int:
    from ..computation.client import ComputationClient

    from ..data_owner.domain import DomainSpec

    with ComputationClient(args.computation, **conn(args)) as cs:
        study = cs.study_status(args.study)
        contract = study.contract
        spec = contract.domain_spec
        domain = DomainSpec.parse(spec) if spec else None
        r = cs.direct_range_counts(args.study, resolve_ranges(args.range, domain, args.study), args.epsilon,
                                   force=args.force, request_key=args.request_key or "")
    answers = [{**c.as_dict(), "label": range_label(c.lo, c.hi, domain)} for c in r.counts]
    if args.confidence is not None:
        # Each answer is one measured value: this server's draw plus the key holders' (at least one draw, K/(K - T)
        # draws' worth with noise_tolerates T > 0, K not known here: then the bound valid for any K).
        for a in answers:
            ci = value_interval(a["value"], a["standard_error"], args.confidence, draws=contract.noise_parties,
                                draws_exact=not contract.noise_tolerates)
            a.update(ci_lo=ci.lo, ci_hi=ci.hi, confidence=ci.confidence, interval_method=ci.method)
    if args.json:
        print_json({"request_id": r.request_id, "study_id": args.study, "epsilon": args.epsilon,
                    "range_counts": answers,
                    "epsilon_charged": r.epsilon_charged,
                     "epsilon_sequential": r.epsilon_sequential, "epsilon_remaining": r.epsilon_remaining,
                     "owners": list(r.owners)})
        return 0
    for a in answers:
        print(f"{a['label']}: {a['value']:.0f} +- {a['standard_error']:.1f}{_interval_text(a)}")
    if args.confidence is not None:
        print(f"{_interval_heading(args.confidence)}: {describe(args.confidence)}")
    total = r.epsilon_remaining + r.epsilon_charged  # only for the "nothing usable" threshold
    if study.t_of_n:  # the holders sign one charge per range on the study's log: no overlap discount
        rule = (f"each range in full: with a {study.holders_per_measurement}-of-{study.key_holders} key every range "
                "is its own charge in the study's signed charge log")
    else:
        masks = (" + 2^-20 for the masked prefix the decryption server sees in front of a range not starting at "
                 "bin 0" if any(c.lo > 0 for c in r.counts) else "")
        rule = f"max-overlap rule{masks}; a plain sum would be {r.epsilon_sequential:g}"
    print(f"charged epsilon {r.epsilon_charged:.12g} ({rule}); {epsilon_left(r.epsilon_remaining, total)} left in "
          f"study {args.study}")
    return 0



def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    comp = computation_target()
    rel = add("release", lambda a: 2, "run or inspect a release (operator)")
    rsub = rel.add_subparsers(dest="release_command", required=True, metavar="ACTION")
    text = "release a study (waits for the summary unless --no-wait); spends epsilon from its budget"
    p = rsub.add_parser("run", help=text, description=text)
    p.set_defaults(func=cmd_release_run)
    p.add_argument("study", help="study id")
    p.add_argument("--epsilon", type=_epsilon_or_rest, required=True, metavar="EPS|rest",
                   help="epsilon to spend (> 0), or `rest` for exactly what is left of the study's budget")
    p.add_argument("--force", action="store_true",
                   help="release even if some expected owners have not submitted (a signed study's uploads then "
                        "close on the owners present: a missing owner can no longer upload)")
    p.add_argument("--no-wait", action="store_true", help="return at once; poll with `dpagg release status`")
    p.add_argument("--request-key", default="", metavar="KEY",
                   help="idempotency key (default: generated, kept in --state-dir until the release finishes, so "
                        "re-running after an interrupt attaches to the same release)")
    p.add_argument("--state-dir", default=os.environ.get("DPAGG_STATE_DIR", "~/.dpagg"), metavar="DIR",
                   help="where pending request keys are kept (env DPAGG_STATE_DIR; default ~/.dpagg)")
    p.add_argument("--computation", **comp)
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)
    p = rsub.add_parser("status", help="show a release", description="show a release: state, epsilon, owners, "
                                                                       "partitions; exit 1 if it FAILED")
    p.set_defaults(func=cmd_release_status)
    p.add_argument("release", help="release id")
    p.add_argument("--computation", **comp)
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)

    p = add("query", cmd_query, "analyst: list releases, show a summary, range counts with standard errors")
    p.add_argument("release", nargs="?", help="release id, or `latest` (the newest finished release of --study); "
                                              "omit with --list")
    p.add_argument("--list", action="store_true", help="list finished releases")
    p.add_argument("--study",
                   help="with --list: only this study; with `latest`: the study whose newest release to read")
    p.add_argument("--range", type=range_arg, action="append", metavar="LO:HI|COLUMN=LO:HI",
                   help="bins [LO, HI) to count, or values: age=20:40 counts 20 <= age < 40 (LO and HI must be bin "
                        "edges); repeatable; default the whole domain")
    p.add_argument("--csv", action="store_true",
                   help="print the range answers as CSV (lo,hi,label,value,standard_error,cuts_partition)")
    p.add_argument("--show", action="store_true", help="also print the partitions and their noisy sums")
    p.add_argument("--confidence", type=confidence_arg, metavar="LEVEL",
                   help="also print a confidence interval at this level (e.g. 0.95) for each range, computed from "
                        "the noise added (post-processing: spends nothing)")
    p.add_argument("--table", action="store_true",
                   help="a join study's release: print the joint table (the default when no --range is given)")
    p.add_argument("--analyst", default=default_target(ENV_ANALYST), type=server_address,
                   help=f"analyst service host:port (env {ENV_ANALYST}, else {ENV_COMPUTATION}; default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)

    p = add("direct-query", cmd_direct_query, "analyst: noisy range counts straight from the encrypted aggregate "
                                              "(spends budget: max-overlap charge; each range in full with a "
                                              "t-of-N key)")
    p.add_argument("study", help="study id")
    p.add_argument("--range", type=range_arg, action="append", metavar="LO:HI|COLUMN=LO:HI", required=True,
                   help="bins [LO, HI) to count, or values: age=20:40 counts 20 <= age < 40 (LO and HI must be bin "
                        "edges); repeatable")
    p.add_argument("--epsilon", type=float, required=True, help="epsilon of each answer")
    p.add_argument("--force", action="store_true", help="count even if some expected owners have not submitted")
    p.add_argument("--request-key", help="idempotency key: a retry returns the first answers and charges nothing")
    p.add_argument("--confidence", type=confidence_arg, metavar="LEVEL",
                   help="also print a confidence interval at this level (e.g. 0.95) for each answer")
    p.add_argument("--computation", **comp)
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)
