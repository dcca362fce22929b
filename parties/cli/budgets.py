"""`dpagg budget` across key-share holders: every holder's view of a study's budget, and where they disagree.

With K key-share holders (docs/threshold.md, section 6) every holder keeps its own ledger and charges
it before it issues its share, so the K views of a study should be equal: the same total, the same
spend, the same charges. A holder whose ledger was rolled back (an old file copied over it, a lost
WAL) shows less spend than the others; this module names it. Reading a view spends nothing.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from .options import server_address

if TYPE_CHECKING:
    from ..common.receipts import Receipt
    from ..decryption.client import BudgetInfo

__all__ = ["HolderView", "ReceiptFindings", "budget_json", "budget_lines", "check_receipts", "disagreements",
           "holder_endpoint", "view_of"]

#: A charge as compared between ledgers and receipts: (release id, kind, epsilon).
ChargeKey = tuple[str, str, float]

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


def _charge_key(c: Any) -> ChargeKey:
    """What makes two holders' charge rows the same charge: release, kind, epsilon (not row id or time)."""
    return (c.release_id, c.kind, c.epsilon)


def _what(key: ChargeKey) -> str:
    return f"release {key[0]} {key[1]} {key[2]:.12g}"


@dataclass
class ReceiptFindings:
    """What the computation server's receipts say about each ledger (`check_receipts`).

    `rolled_back`: one "ROLLED BACK: ..." line per ledger lacking a charge its own key signed a
    receipt for. `missed`: per holder, the charges only the other holders signed receipts for
    and its ledger lacks (it was down when they were charged), with `proofs`, those receipts
    (what `dpagg budget --reconcile` sends it). `notes`: ledgers that could not be checked.
    """

    rolled_back: list[str] = field(default_factory=list)
    rolled_back_holders: set[str] = field(default_factory=set)
    missed: dict[str, Counter[ChargeKey]] = field(default_factory=dict)
    proofs: dict[str, list["Receipt"]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    signers: dict[str, list[str]] = field(default_factory=dict)

    def missed_lines(self) -> list[str]:
        out = []
        for name, keys in self.missed.items():
            for key in sorted(keys.elements()):
                who = ", ".join(self.signers.get(f"{name}|{key}", [])) or "the other holders"
                out.append(f"MISSED BY {name}: {_what(key)} (it was unreachable; no share was issued by it; {who} "
                           "hold it with signed receipts): `dpagg budget --reconcile` books it there")
        return out


def _rebooked_through(b: "BudgetInfo") -> int:
    """The newest charge id an acknowledged rollback (`dpagg ledger restore`) re-booked, 0 when none."""
    from ..decryption.receipts import ROLLBACK_KIND

    through = 0
    for c in b.charges:
        if c.kind == ROLLBACK_KIND and c.release_id.startswith("rollback-"):
            try:
                through = max(through, int(c.release_id.removeprefix("rollback-")))
            except ValueError:
                continue
    return through


def check_receipts(study_id: str, views: Sequence[HolderView], receipts: Sequence["Receipt"]) -> ReceiptFindings:
    """Check every answering ledger against the computation server's `receipts` of the study.

    A receipt counts for a ledger when it verifies under that ledger's receipt key (as its
    BudgetStatus reports it); receipts under no answering holder's key, or that do not verify,
    prove nothing and are ignored. A ledger must hold the charge row of every receipt its own
    key signed (or an acknowledged rollback's re-booking covering it): else it was ROLLED BACK.
    A charge that other, not rolled back, holders signed receipts for and this ledger lacks,
    while this holder signed none for it, was MISSED: the holder was unreachable, booked
    nothing and (a holder books before it issues a share) issued no share for it. Reads only.
    """
    from fractions import Fraction

    from ..common.receipts import verify_receipt

    found = ReceiptFindings()
    signed: dict[str, list["Receipt"]] = {}
    for v in views:
        if v.budget is None:
            continue
        key = v.budget.receipt_key
        if not key:
            found.notes.append(f"{v.name} does not report its receipt key: its ledger was not checked against "
                               "the computation server's receipts")
            continue
        mine: dict[int, "Receipt"] = {}
        for r in receipts:
            if r.public_key == key and r.study_id == study_id and verify_receipt(key, r.body, r.signature):
                mine[r.charge_id] = r
        signed[v.name] = sorted(mine.values(), key=lambda r: r.charge_id)
        rows = {c.charge_id: c for c in v.budget.charges}
        through = _rebooked_through(v.budget)
        lacking = [r for r in signed[v.name] if r.charge_id > through and not (
            r.charge_id in rows and _charge_key(rows[r.charge_id]) == (r.release_id, r.kind, r.epsilon))]
        newest = signed[v.name][-1] if signed[v.name] else None
        if not lacking and newest is not None and newest.charge_id > through \
                and Fraction(v.budget.spent) < newest.study_spent * (1 - Fraction(1, 10**9)):
            lacking = [newest]
        if lacking:
            r = lacking[-1]
            more = f"; {len(lacking)} charges with receipts are missing" if len(lacking) > 1 else ""
            found.rolled_back.append(
                f"ROLLED BACK: ledger of {v.name} lacks charge #{r.charge_id} ({_what((r.release_id, r.kind, r.epsilon))}) "
                f"that the computation server holds a signed receipt for (spent {v.budget.spent:.12g}, receipt says "
                f"{float(r.study_spent):.12g}){more}")
            found.rolled_back_holders.add(v.name)
    sound = [v for v in views if v.budget is not None and v.name in signed and v.name not in found.rolled_back_holders]
    for v in sound:
        assert v.budget is not None
        held = Counter(_charge_key(c) for c in v.budget.charges)
        own = Counter((r.release_id, r.kind, r.epsilon) for r in signed[v.name])
        proved: Counter[ChargeKey] = Counter()
        by: dict[ChargeKey, list[str]] = {}
        proofs: list["Receipt"] = []
        for u in sound:
            if u is v:
                continue
            theirs = Counter((r.release_id, r.kind, r.epsilon) for r in signed[u.name])
            for k, n in theirs.items():
                if n > held[k] and own[k] <= held[k]:
                    proved[k] = max(proved[k], n - held[k])
                    by.setdefault(k, []).append(u.name)
                    proofs.extend(r for r in signed[u.name] if (r.release_id, r.kind, r.epsilon) == k)
        if proved:
            found.missed[v.name] = proved
            found.proofs[v.name] = proofs
            for k, names in by.items():
                found.signers[f"{v.name}|{k}"] = names
    return found


def _figure(b: "BudgetInfo", figure: str) -> Any:
    return Counter(_charge_key(c) for c in b.charges) if figure == "charges" else getattr(b, figure)


def disagreements(views: Sequence[HolderView], missed: "dict[str, Counter[ChargeKey]] | None" = None) -> list[str]:
    """One line per figure the answering holders differ on, each starting "DISAGREE:", naming holders and values.

    Spend figures are compared exactly: every holder books the same charges in the same order,
    so equal ledgers give bit-equal sums. A holder that did not answer is a disagreement too
    (nobody can tell its view). `missed` (`ReceiptFindings.missed`): charges a holder lacks
    because it was down when the others booked them, proved by their signed receipts: they
    count as held in the charges comparison, and that holder's spend figures (short by them)
    are left out of the spend comparison; its MISSED BY lines say so instead.
    """
    missed = missed or {}
    if any(v.budget is not None and v.budget.key_threshold for v in views):
        # t-of-N: each holder's ledger holds the requests it answered, and a holder may be down; the signed charge
        # log is the spend, and every holder checks it whole before it signs or answers (nothing to compare here)
        return []
    lines = [f"DISAGREE: {v.name} did not answer ({v.error})" for v in views if v.budget is None]
    answered = [v for v in views if v.budget is not None]
    for figure in FIGURES:
        if figure == "charges":
            values = [(v.name, _figure(v.budget, figure) + missed.get(v.name, Counter()))
                      for v in answered if v.budget is not None]
        else:
            values = [(v.name, _figure(v.budget, figure)) for v in answered if v.budget is not None
                      and (figure == "total" or not missed.get(v.name))]
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
    out = {"address": v.address, "total": b.total, "spent": b.spent, "remaining": b.remaining,
           "available": b.available, "charges": [vars(c) for c in b.charges], "chain_problem": b.chain_problem}
    if b.key_threshold:
        out["charge_log"] = {"threshold": b.key_threshold, "charges": b.charge_log_entries,
                             "spent": b.charge_log_spent, "signed": list(b.charges_signed)}
    return out


def budget_json(study_id: str, views: Sequence[HolderView], found: ReceiptFindings | None = None,
                cs_log: tuple[int, str] | None = None) -> dict[str, Any]:
    """`{"study_id", "holders": {name: view}, "agree": bool, "disagreements": [line...]}`; with receipts checked
    (`found`) also "rolled_back" and "missed" (lines) and "receipt_notes"; with `cs_log` (t-of-N) also
    "computation_log": {"charges", "spent" (exact, a fraction's text), "ahead_of": [holder...]}."""
    problems = disagreements(views, found.missed if found else None)
    out: dict[str, Any] = {"study_id": study_id, "holders": {v.name: _view_dict(v) for v in views},
                           "agree": not problems, "disagreements": problems}
    if cs_log is not None:
        out["computation_log"] = {"charges": cs_log[0], "spent": cs_log[1] or "0",
                                  "ahead_of": _behind(views, cs_log[0])}
    if found is not None:
        out.update(rolled_back=found.rolled_back, missed=found.missed_lines(), receipt_notes=found.notes)
    return out


def _behind(views: Sequence[HolderView], entries: int) -> list[str]:
    """The t-of-N holders whose view of the signed charge log has fewer than `entries` charges (or that gave none)."""
    return [v.name for v in views if v.budget is None or v.budget.charge_log_entries < entries]


def cs_log_line(views: Sequence[HolderView], cs_log: tuple[int, str]) -> str:
    """Where the computation server's copy of the signed charge log stands against the holders' views: ahead of
    which (they lag until their next request), and what is left by it, exactly (`charges.exact_text`)."""
    from fractions import Fraction

    from ..decryption.keyshare.charges import exact_text

    entries, spent_text = cs_log
    total = next((v.budget.total for v in views if v.budget is not None), 0.0)
    spent = Fraction(spent_text or "0")
    left = max(Fraction(0), Fraction(repr(float(total))) - spent)
    behind = _behind(views, entries)
    where = (f"AHEAD of the view of {', '.join(behind)} (a holder catches up at its next request; until then its "
             "figures above lag)" if behind else "every holder's view is up to date")
    return (f"the computation server's signed charge log: {entries} charge(s), {exact_text(spent)} of "
            f"{exact_text(float(total))} spent, {exact_text(left)} left (what releases, direct queries and status "
            f"see, exactly); {where}")


def log_status_line(total: float, cs_log: tuple[int, str]) -> str:
    """`dpagg status` with a t-of-N key: the study's budget by the computation server's signed charge log, exactly,
    as releases, direct queries and `dpagg budget` compute it (`charges.log_budget`; the running release's hold
    is the server's to add while it runs)."""
    from fractions import Fraction

    from ..decryption.keyshare.charges import exact_text

    spent = Fraction(cs_log[1] or "0")
    left = max(Fraction(0), Fraction(repr(float(total))) - spent)
    return (f"budget: spent {exact_text(spent)} of {exact_text(float(total))}, {exact_text(left)} left "
            f"({cs_log[0]} charge(s) in the signed charge log)")


def budget_lines(study_id: str, views: Sequence[HolderView], found: ReceiptFindings | None = None,
                 cs_log: tuple[int, str] | None = None) -> list[str]:
    """The text report: one block per holder, then either the DISAGREE lines or that every view agrees. `cs_log`:
    the computation server's (charges, spent) of a t-of-N study's signed log (`ComputationClient.charge_log`)."""
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
        if b.key_threshold:
            out.append(f"  its view of the signed charge log ({b.key_threshold}-of-N key): {b.charge_log_entries} "
                       f"charge(s), {b.charge_log_spent:.12g} spent; it signed position(s) "
                       f"{', '.join(str(i) for i in b.charges_signed) or 'none'}")
        out.extend(f"  #{n} {c.created_at} release {c.release_id}: {c.kind} {c.epsilon:.12g}"
                   for n, c in enumerate(b.charges, 1))
    tofn = [v.budget for v in views if v.budget is not None and v.budget.key_threshold]
    if tofn:  # own ledgers differ by design: each holds what its holder answered; the log is the spend
        longest = max(tofn, key=lambda b: b.charge_log_entries)
        out.append(f"t-of-N key: the study's spend is its signed charge log; the longest view a holder verified has "
                   f"{longest.charge_log_entries} charge(s), {longest.charge_log_spent:.12g} of {longest.total:.12g} "
                   "spent (a holder that was down catches up at its next request); each holder's own ledger holds "
                   "the requests it answered")
        if cs_log is not None:
            out.append(cs_log_line(views, cs_log))
        return out
    problems = disagreements(views, found.missed if found else None)
    if found is not None:
        out.extend(found.rolled_back + found.missed_lines())
    out.extend(problems or [f"all {len(views)} holders agree"
                            + (" once the missed charges are booked" if found and found.missed else "")])
    return out
