"""`dpagg accuracy`: the error a release will carry for ranges of a given length, before any budget is spent.

Offline from the terms (`--domain` or `--domain-size`, `--epsilon`, `--strategy`, ...) or from an open
study's contract (`--study`, read from the computation server). open-study prints the same preview
for its terms. Nothing here measures, draws noise or spends budget (he_partition.methods.accuracy).
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from he_partition.core.errors import DPAggError, InvalidInputError

from .options import (Subparsers, command_adder, computation_target, conn, domain_size, domain_spec, positive_int,
                      print_json, tls_args)
from .releases import confidence_arg

if TYPE_CHECKING:
    from he_partition.methods.accuracy import AccuracyPreview

    from ..common.contract import StudyContract
    from ..data_owner.domain import DomainSpec

__all__ = ["add_parser", "open_study_preview", "preview_lines"]


def _width_text(length: int, domain: "DomainSpec | None") -> str:
    if domain is None or domain.is_categorical:
        return ""
    widths = {round(domain.edges[i + length] - domain.edges[i], 9) for i in range(domain.n_bins - length + 1)}
    if len(widths) != 1:
        return ""
    return f" ({domain.column} width {next(iter(widths)):g})"


def preview_lines(preview: "AccuracyPreview", domain: "DomainSpec | None" = None, *, epsilon: float | None = None,
                  ) -> list[str]:
    """The preview in words: a heading, then one line per range length (with its width in the domain's values)."""
    shown = preview.epsilon if epsilon is None else epsilon
    head = (f"accuracy preview at epsilon {shown:g} (no budget spent; strategy {preview.strategy}, design "
            f"{preview.design}, noise of {preview.noise_draws:g} draws per value, on dense data):")
    lines = [head]
    for r, text in zip(preview.ranges, preview.lines()):
        width = _width_text(r.length, domain)
        lines.append("  " + text.replace(f"bin{'s' if r.length != 1 else ''}:", f"bin{'s' if r.length != 1 else ''}"
                                         f"{width}:", 1))
    return lines


def _lengths(args: argparse.Namespace, domain: "DomainSpec | None") -> list[int] | None:
    lengths = list(args.length or [])
    for width in args.width or []:
        if domain is None or domain.is_categorical:
            raise DPAggError("--width is in the domain's values: give a numeric --domain (or a study with one), "
                             "or the length in bins with --length")
        bin_widths = {round(b - a, 9) for a, b in zip(domain.edges, domain.edges[1:])}
        step = next(iter(bin_widths))
        if len(bin_widths) != 1 or not math.isclose(width / step, round(width / step), rel_tol=1e-9):
            raise DPAggError(f"--width {width:g}: not a whole number of bins of {domain.column} (bins are "
                             f"{', '.join(f'{w:g}' for w in sorted(bin_widths))} wide); give --length in bins")
        lengths.append(int(round(width / step)))
    return sorted(set(lengths)) or None


def cmd_accuracy(args: argparse.Namespace) -> int:
    from he_partition.methods.accuracy import accuracy_preview

    from ..data_owner.domain import DomainSpec

    domain: DomainSpec | None = None
    if args.study:
        from ..common.accuracy import study_accuracy
        from ..computation.client import ComputationClient

        with ComputationClient(args.computation, **conn(args)) as cs:
            contract = cs.study_status(args.study).contract
        domain = DomainSpec.parse(contract.domain_spec) if contract.domain_spec else None
        preview = study_accuracy(contract, epsilon=args.epsilon, lengths=_lengths(args, domain),
                                   confidence=args.confidence)
        shown = contract.epsilon if args.epsilon is None else args.epsilon
    else:
        if args.epsilon is None:
            raise DPAggError("give --epsilon (the release's), or --study ID to preview an open study")
        domain = DomainSpec.parse(args.domain) if args.domain else None
        n = domain.n_bins if domain is not None else args.domain_size
        if not n:
            raise DPAggError("give the domain: --domain COLUMN:LO:HI:BINS, --domain-size N, or --study ID")
        preview = accuracy_preview(n, args.epsilon, _lengths(args, domain), strategy=args.strategy,
                                   confidence=args.confidence, noise_parties=args.noise_parties,
                                   contribution_bound=args.contribution_bound * args.max_organizations)
        shown = args.epsilon
    if args.json:
        print_json({**preview.as_dict(), "epsilon": shown, "dp_epsilon": preview.epsilon})
        return 0
    print("\n".join(preview_lines(preview, domain, epsilon=shown)))
    return 0


def add_parser(sub: Subparsers) -> None:
    add = command_adder(sub)
    p = add("accuracy", cmd_accuracy,
            "preview a release's error before any budget is spent: the expected error and the confidence interval "
            "of a range of a given length, for a study's terms or an open study")
    p.add_argument("--study", help="preview this open study's terms (read from the computation server)")
    p.add_argument("--domain", type=domain_spec, help="COLUMN:LO:HI:BINS (or COLUMN:edges:..., COLUMN:categories:...)")
    p.add_argument("--domain-size", type=domain_size, default=0, help="number of bins, when there is no --domain")
    p.add_argument("--epsilon", type=float,
                   help="the release's epsilon (with --study: default the study's whole budget)")
    p.add_argument("--strategy", default="auto", help="auto (default), hier or privelet; gap and dawa choose their "
                   "partition from the data, so their error cannot be previewed")
    p.add_argument("--contribution-bound", type=positive_int, default=1, help="records per person (default 1)")
    p.add_argument("--max-organizations", type=positive_int, default=1,
                   help="organizations one person may appear in (default 1)")
    p.add_argument("--noise-parties", type=int, choices=(1, 2), default=2, help="noise draws per value (default 2)")
    p.add_argument("--length", type=positive_int, action="append",
                   help="range length in bins (repeatable; default: 1 bin, a tenth and half of the domain)")
    p.add_argument("--width", type=float, action="append",
                   help="range width in the domain's values, e.g. 10 (years); a whole number of bins (repeatable)")
    p.add_argument("--confidence", type=confidence_arg, default=0.95, metavar="LEVEL", help="interval level (default 0.95)")
    p.add_argument("--json", action="store_true", help="print the preview as JSON")
    p.add_argument("--computation", **computation_target())
    tls_args(p)


def open_study_preview(contract: "StudyContract") -> tuple[list[str], dict[str, Any] | None]:
    """What open-study adds: the preview's lines and JSON for the study's whole budget, or a line saying why
    there is none (a data-dependent strategy)."""
    from ..common.accuracy import study_accuracy
    from ..data_owner.domain import DomainSpec

    try:
        preview = study_accuracy(contract)
    except InvalidInputError as exc:
        return [f"accuracy preview: none ({exc})"], None
    domain = DomainSpec.parse(contract.domain_spec) if contract.domain_spec else None
    lines = preview_lines(preview, domain, epsilon=contract.epsilon)
    lines.append("  (a release of less epsilon has more error: `dpagg accuracy --study "
                 f"{contract.study_id} --epsilon E`)")
    return lines, preview.as_dict()
