"""`dpagg budget` across key-share holders: every holder's view of a study's budget, and where they disagree.

With K key-share holders (docs/threshold.md, section 6) every holder keeps its own ledger and charges
it before it issues its share, so the K views of a study should be equal: the same total, the same
spend, the same charges. A holder whose ledger was rolled back (an old file copied over it, a lost
WAL) shows less spend than the others; this module names it. Reading a view spends nothing.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .options import server_address

if TYPE_CHECKING:
    from ..decryption.client import BudgetInfo

__all__ = ["HolderView", "budget_json", "budget_lines", "disagreements", "holder_endpoint", "view_of"]

#: Figures compared between holders, in the order DISAGREE lines are printed.
FIGURES = ("total", "spent", "remaining", "charges")


def holder_endpoint(text: str) -> tuple[str, str]:
    """`--decryption` value: HOST:PORT (the holder is named by its address) or NAME=HOST:PORT."""
    name, sep, address = text.partition("=")
    if not sep:
        return text, server_address(text)
    if not name.strip():
        raise argparse.ArgumentTypeError(f"give the holder as NAME=HOST:PORT or HOST:PORT, got {text!r}")
    return name.strip(), server_address(address)


@dataclass(frozen=True)
class HolderView:
    """One holder's answer to BudgetStatus, or why it gave none (`error`; then `budget` is None)."""

    name: str
    address: str
    budget: "BudgetInfo | None" = None
    error: str = ""


def view_of(name: str, address: str, fetch: Any) -> HolderView:
    """Ask one holder (`fetch(address) -> BudgetInfo`); a refusal or an unreachable holder becomes its error."""
    from ..common.errors import ServiceError

    try:
        return HolderView(name, address, fetch(address))
    except ServiceError as exc:
        return HolderView(name, address, error=f"{exc.code.name}: {exc.details}")


def _charge_key(c: Any) -> tuple[str, str, float]:
    """What makes two holders' charge rows the same charge: release, kind, epsilon (not row id or time)."""
    return (c.release_id, c.kind, c.epsilon)


def _figure(b: "BudgetInfo", figure: str) -> Any:
    return Counter(_charge_key(c) for c in b.charges) if figure == "charges" else getattr(b, figure)


def disagreements(views: Sequence[HolderView]) -> list[str]:
    """One line per figure the answering holders differ on, each starting "DISAGREE:", naming holders and values.

    Spend figures are compared exactly: every holder books the same charges in the same order,
    so equal ledgers give bit-equal sums. A holder that did not answer is a disagreement too
    (nobody can tell its view).
    """
    lines = [f"DISAGREE: {v.name} did not answer ({v.error})" for v in views if v.budget is None]
    answered = [v for v in views if v.budget is not None]
    for figure in FIGURES:
        values = [(v.name, _figure(v.budget, figure)) for v in answered if v.budget is not None]
        if len({repr(sorted(x.items())) if isinstance(x, Counter) else repr(x) for _, x in values}) <= 1:
            continue
        if figure == "charges":
            union: Counter[tuple[str, str, float]] = Counter()
            for _, held in values:
                union |= held
            for name, held in values:
                lacks = union - held
                if lacks:
                    what = "; ".join(f"release {r} {k} {e:.12g}" for r, k, e in sorted(lacks.elements()))
                    lines.append(f"DISAGREE: charges: {name} lacks {sum(lacks.values())} of "
                                 f"{sum(union.values())} ({what})")
        else:
            shown = ", ".join(f"{name} {x:.12g}" for name, x in values)
            note = ""
            if figure == "spent":
                low = min(x for _, x in values)
                note = f" (behind: {', '.join(n for n, x in values if x == low)})"
            lines.append(f"DISAGREE: {figure}: {shown}{note}")
    return lines


def _view_dict(v: HolderView) -> dict[str, Any]:
    if v.budget is None:
        return {"address": v.address, "error": v.error}
    b = v.budget
    return {"address": v.address, "total": b.total, "spent": b.spent, "remaining": b.remaining,
            "available": b.available, "charges": [vars(c) for c in b.charges], "chain_problem": b.chain_problem}


def budget_json(study_id: str, views: Sequence[HolderView]) -> dict[str, Any]:
    """`{"study_id", "holders": {name: view}, "agree": bool, "disagreements": [line...]}`."""
    problems = disagreements(views)
    return {"study_id": study_id, "holders": {v.name: _view_dict(v) for v in views}, "agree": not problems,
            "disagreements": problems}


def budget_lines(study_id: str, views: Sequence[HolderView]) -> list[str]:
    """The text report: one block per holder, then either the DISAGREE lines or that every view agrees."""
    from he_partition.core.accounting import epsilon_left

    out = [f"study {study_id} at {len(views)} holders:"]
    for v in views:
        if v.budget is None:
            out.append(f"holder {v.name} ({v.address}): no answer: {v.error}")
            continue
        b = v.budget
        out.append(f"holder {v.name} ({v.address}): spent {b.spent:.12g} of {b.total:.12g}, remaining "
                   f"{b.remaining:.12g}; a new release may spend {epsilon_left(b.available, b.total)}; "
                   f"{len(b.charges)} charge(s)")
        out.extend(f"  #{n} {c.created_at} release {c.release_id}: {c.kind} {c.epsilon:.12g}"
                   for n, c in enumerate(b.charges, 1))
    problems = disagreements(views)
    out.extend(problems or [f"all {len(views)} holders agree"])
    return out
