"""A study's budget in t-of-N mode: a chain of charges, each valid only with the signatures of t holders.

Why a chain. With N-of-N keys every holder takes part in every decryption, so each holder's own
ledger sees every charge. With t-of-N keys the computation server (CS) picks which t holders answer
a request, and a holder that was not asked never hears of it: per-holder ledgers would let the CS
spend the budget once with {1, 2}, again with {2, 3} and again with {1, 3}. So the charges of a
study form one log that every holder checks before it signs or answers:

- a charge (`ChargeEntry`) names the study, its position `index` in the log, the digest of the
  entry before it (`previous`), the request it pays for (the measurement's label digest), its
  epsilon (an exact fraction) and the participant set: the t holders that will issue shares for it,
  fixed before anyone draws noise;
- a charge is valid (`SignedCharge.valid`) when at least t distinct holders of the key signed its
  statement (Ed25519, domain-separated; each holder's public key is pinned at setup);
- holder h signs entry E only against the study's whole log L (`ChargeBook.sign`): every entry
  of L valid and chained, E at position len(L) after L's last entry, sum(L) + epsilon(E) within
  the study's budget, E's request not charged before, and h never signed another entry at
  E.index or any entry at a later index (a log that omits a charge h signed is refused, naming
  it). h records what it signed in its own SQLite file before returning the signature;
- before issuing a share for a request, a holder requires the whole log again and the request's
  valid charge in it with itself among the participants (`ChargeBook.authorize`). A holder that
  was down catches up here: it checks the log and records it as its view of the study's spend.

Why no routing overspends (t > N/2). Two sets of t holders share a holder. An honest holder
signs at most one entry per index, so at most one entry per index is valid (two would need a
holder that signed both); each valid entry's previous is a valid entry (its signers checked L),
so the valid entries form a single chain, and every one of them was signed by an honest holder
only after it checked the chain's total up to it against the budget. So the epsilon of all valid
charges together is at most the budget, whatever subsets the CS asks, in whatever order, with
whatever replays or omissions (tests/parties/test_tofn_charges.py tries them all for K = 3, t = 2).

The collusion limit, plainly. The argument needs an honest holder in every intersection of two
t-sets: 2t - N > f for f holders colluding with the CS (`budget_collusion_tolerance`). For K = 3,
t = 2 that is f = 0: the CS together with one holder can sign two different entries at one index
and spend the budget once per honest holder (the test shows it). K = 4, t = 3 tolerates one such
holder and still releases with one holder down; N-of-N tolerates N - 1. The key's secrecy is
separate (any t - 1 holders learn nothing about it: `he_partition.he.threshold.shamir`).
Holds no secret but the holder's signing key; adds no noise.
"""
from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.protocol import EPSILON_TOLERANCE

from ...common.contract import StudyContract
from ...common.errors import FailedPreconditionError
from ...common.util import utc_now

__all__ = ["ChargeBook", "ChargeEntry", "ChargeRules", "LogBudget", "SignedCharge", "budget_collusion_tolerance",
           "log_epsilon",
           "below", "chain_total", "charge_epsilon", "charge_request", "dump_log", "exact_text", "load_log", "log_budget"]

_TAG = b"dpagg/tofn-charge/v1\x00"
GENESIS = ""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tofn_signed (
    study_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    digest TEXT NOT NULL,
    entry TEXT NOT NULL,
    signature BLOB NOT NULL,
    signed_at TEXT NOT NULL,
    PRIMARY KEY (study_id, idx)
);
CREATE TABLE IF NOT EXISTS tofn_log (
    study_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    charge TEXT NOT NULL,
    PRIMARY KEY (study_id, idx)
);
"""


def budget_collusion_tolerance(holders: int, threshold: int) -> int:
    """How many holders may collude with the CS while no routing overspends a budget: 2t - N - 1 (>= 0)."""
    return max(0, 2 * threshold - holders - 1)


@dataclass(frozen=True)
class ChargeEntry:
    """One charge of a study's log (what t holders sign)."""

    study_id: str
    index: int
    previous: str
    request: str
    epsilon: Fraction
    participants: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"study_id": self.study_id, "index": self.index, "previous": self.previous, "request": self.request,
                "epsilon": str(self.epsilon), "participants": list(self.participants)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ChargeEntry":
        try:
            eps = Fraction(str(d["epsilon"]))
            entry = cls(str(d["study_id"]), int(d["index"]), str(d["previous"]), str(d["request"]), eps,
                        tuple(int(p) for p in d["participants"]))
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
            raise InvalidInputError(f"not a charge entry: {exc}") from exc
        if entry.index < 0 or not entry.epsilon > 0 or not entry.request:
            raise InvalidInputError(f"charge entry {entry.index}: index >= 0, epsilon > 0 and a request id needed")
        return entry

    def statement(self) -> bytes:
        return _TAG + json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.statement()).hexdigest()


@dataclass(frozen=True)
class SignedCharge:
    """A charge entry with the signatures gathered so far (holder -> Ed25519 signature on its statement)."""

    entry: ChargeEntry
    signatures: Mapping[int, bytes] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry.to_dict(), "signatures": {str(h): s.hex() for h, s in sorted(self.signatures.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SignedCharge":
        try:
            sigs = {int(h): bytes.fromhex(s) for h, s in dict(d["signatures"]).items()}
            entry = d["entry"]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidInputError(f"not a signed charge: {exc}") from exc
        return cls(ChargeEntry.from_dict(entry), sigs)

    def with_signature(self, holder: int, signature: bytes) -> "SignedCharge":
        return SignedCharge(self.entry, {**self.signatures, holder: signature})


@dataclass(frozen=True)
class ChargeRules:
    """The public facts every holder checks a log against: the holders' signing keys and the threshold."""

    public_keys: Mapping[int, bytes]
    threshold: int
    #: (holder, statement digest, signature) triples already verified: a log is checked at every request, and
    #: each of its signatures needs verifying once (Ed25519 verification costs about 0.15 ms).
    _verified: set[tuple[int, str, bytes]] = field(default_factory=set, compare=False, repr=False)

    def signers(self, charge: SignedCharge) -> list[int]:
        """The holders whose signature on the charge's statement verifies (unknown holders and bad signatures
        are ignored: they count for nothing)."""
        ok = []
        statement = charge.entry.statement()
        digest = charge.entry.digest()
        for holder, sig in charge.signatures.items():
            key = self.public_keys.get(holder)
            if key is None:
                continue
            if (holder, digest, sig) not in self._verified:
                try:
                    Ed25519PublicKey.from_public_bytes(key).verify(sig, statement)
                except (InvalidSignature, ValueError):
                    continue
                self._verified.add((holder, digest, bytes(sig)))
            ok.append(holder)
        return sorted(ok)

    def valid(self, charge: SignedCharge) -> bool:
        return len(self.signers(charge)) >= self.threshold

    def check_participants(self, entry: ChargeEntry) -> None:
        p = entry.participants
        if len(set(p)) != len(p) or len(p) != self.threshold or not set(p) <= set(self.public_keys):
            raise InvalidInputError(f"charge {entry.index} of study {entry.study_id!r} names participants {list(p)}: "
                                    f"needs {self.threshold} distinct holders of {sorted(self.public_keys)}")

    def check_log(self, study_id: str, log: Sequence[SignedCharge]) -> Fraction:
        """The total epsilon of a valid, chained log of one study; FailedPreconditionError naming the first
        entry that is out of place, unchained or short of t signatures."""
        previous = GENESIS
        total = Fraction(0)
        requests: set[str] = set()
        for i, charge in enumerate(log):
            e = charge.entry
            if e.study_id != study_id or e.index != i or e.previous != previous:
                raise FailedPreconditionError(f"the charge log of study {study_id!r} is broken at entry {i}: it is "
                                              f"entry {e.index} of study {e.study_id!r} after {e.previous[:12]!r}, "
                                              f"expected entry {i} after {previous[:12]!r}")
            signers = self.signers(charge)
            if len(signers) < self.threshold:
                raise FailedPreconditionError(f"charge {i} of study {study_id!r} carries {len(signers)} valid holder "
                                              f"signatures {signers}, needs {self.threshold}")
            if e.request in requests:
                raise FailedPreconditionError(f"charge {i} of study {study_id!r} charges request {e.request[:12]} "
                                              "again")
            self.check_participants(e)
            requests.add(e.request)
            total += e.epsilon
            previous = e.digest()
        return total


def charge_request(study_id: str, release_id: str, release_epsilon: float, spec_json: str) -> str:
    """The request id a charge pays for (hex SHA-256): study, release, release epsilon and the measurement's
    canonical spec. The computation server and every holder compute it from the request alone."""
    h = hashlib.sha256(b"dpagg/tofn-request/v1\x00" + json.dumps(
        [study_id, release_id, repr(float(release_epsilon))]).encode() + b"\x00" + spec_json.encode("utf-8"))
    return h.hexdigest()


def charge_epsilon(epsilon: float) -> Fraction:
    """A charge's epsilon as the exact decimal the float prints as (0.1 is 1/10), as the holders' own ledgers
    read it: the log and the ledgers then add up to the same decimals (0.3, never 0.30000000000000004)."""
    return Fraction(repr(float(epsilon)))


def below(x: Fraction) -> float:
    """The largest float whose decimal is <= x: what is left, as a float, never rounds up."""
    f = float(x)
    while Fraction(repr(f)) > x:
        f = math.nextafter(f, -math.inf)
    return f


def exact_text(x: Fraction | float) -> str:
    """An epsilon as printed everywhere: its exact decimal rounded (half-even) to 12 significant digits, never
    through a float (0.625, 0.9; not 0.8999999999999999). Sums of float splits keep their sub-ulp dust in the
    arithmetic (a release of 0.4 split as 0.1 + 0.29999999999999998 spends 0.39999999999999998 exactly); the
    text shows 0.4."""
    from decimal import Decimal, localcontext

    f = Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x)
    if f == 0:
        return "0"
    with localcontext() as ctx:
        ctx.prec = 12
        d = Decimal(f.numerator) / Decimal(f.denominator)
    text = format(d.normalize(), "f")
    return text if len(text) <= 16 else f"{d.normalize():e}"


@dataclass(frozen=True)
class LogBudget:
    """What a t-of-N study has left, exactly, from its signed charge log: `spent` (the log's charges), `held`
    (the epsilon a running release declared and has not charged yet) and `available` (total - spent - held)."""

    total: Fraction
    spent: Fraction
    held: Fraction

    @property
    def reserved(self) -> Fraction:
        return self.spent + self.held

    @property
    def available(self) -> Fraction:
        return max(Fraction(0), self.total - self.reserved)


def log_budget(total: float, log: Sequence[SignedCharge], held: Fraction = Fraction(0)) -> LogBudget:
    """THE view of what a t-of-N study has left: releases, direct queries, `status` and `budget` all read it.

    `held`: what the study's running release declared and the log has not charged for it yet (the computation
    server knows; a release that ended, finished or failed, holds nothing beyond its charges). Exact
    arithmetic: every epsilon is the decimal it prints as. Spends nothing, draws no noise."""
    return LogBudget(charge_epsilon(total), chain_total(log), max(Fraction(0), Fraction(held)))


def dump_log(log: Sequence[SignedCharge]) -> str:
    return json.dumps([c.to_dict() for c in log], separators=(",", ":"))


def load_log(text: str) -> list[SignedCharge]:
    """A charge log from its JSON (`dump_log`); InvalidInputError for anything else."""
    try:
        raw = json.loads(text) if text else []
    except ValueError as exc:
        raise InvalidInputError(f"the charge log is not JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise InvalidInputError("the charge log must be a JSON list of signed charges")
    return [SignedCharge.from_dict(d) for d in raw]


def chain_total(log: Sequence[SignedCharge]) -> Fraction:
    return sum((c.entry.epsilon for c in log), Fraction(0))


class ChargeBook:
    """One holder's side of the charge chain: what it signed (SQLite, `path` None: in memory) and its rules.

    `sign` and `authorize` are the only ways the holder's signature or share is given out; both
    take the study's whole log and its budget (from the holder's own registered contract)."""

    def __init__(self, holder: int, signing_key: bytes, rules: ChargeRules, path: Path | None = None) -> None:
        if holder not in rules.public_keys:
            raise InvalidInputError(f"holder {holder} has no pinned signing key in the rules")
        self.holder, self.rules = holder, rules
        self._key = Ed25519PrivateKey.from_private_bytes(signing_key)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path) if path is not None else ":memory:", check_same_thread=False,
                                   isolation_level=None)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _signed(self, study_id: str) -> dict[int, tuple[str, bytes]]:
        rows = self._db.execute("SELECT idx, digest, signature FROM tofn_signed WHERE study_id = ?", (study_id,))
        return {int(i): (str(d), bytes(s)) for i, d, s in rows.fetchall()}

    def _check_against_own(self, study_id: str, log: Sequence[SignedCharge], upto: int) -> None:
        """Refuse a log shorter than what this holder signed (it omits a charge this holder signed)."""
        for idx in sorted(self._signed(study_id)):
            if idx >= upto:
                raise FailedPreconditionError(
                    f"holder {self.holder} refuses: the charge log of study {study_id!r} has {len(log)} entries and "
                    f"omits charge {idx}, which this holder signed; send the whole log")

    def sign(self, entry: ChargeEntry, log: Sequence[SignedCharge], budget: Fraction) -> bytes:
        """This holder's signature on `entry` appended to `log` (the study's whole valid log), or a refusal.

        Refused (nothing signed): a log that is broken or omits a charge this holder signed
        (FailedPreconditionError), an entry out of place or charging a request again, another entry
        signed at this index (FailedPreconditionError), log + entry over `budget` (BudgetExhaustedError).
        The same entry at the same index is signed again (an idempotent retry)."""
        with self._lock:
            total = self.rules.check_log(entry.study_id, log)
            self._check_known(entry.study_id, log)
            self._remember(entry.study_id, log)  # a verified log is this holder's view, whatever it decides
            self.rules.check_participants(entry)
            want_prev = log[-1].entry.digest() if log else GENESIS
            if entry.index != len(log) or entry.previous != want_prev:
                raise FailedPreconditionError(f"charge for request {entry.request[:12]} names position {entry.index} "
                                              f"after {entry.previous[:12]!r}; the log has {len(log)} entries ending "
                                              f"{want_prev[:12]!r}")
            self._check_against_own(entry.study_id, log, len(log) + 1)
            mine = self._signed(entry.study_id).get(entry.index)
            if mine is not None:
                if mine[0] == entry.digest():
                    return mine[1]
                raise FailedPreconditionError(f"holder {self.holder} already signed another charge at position "
                                              f"{entry.index} of study {entry.study_id!r}; it signs one per position")
            if any(c.entry.request == entry.request for c in log):
                raise FailedPreconditionError(f"request {entry.request[:12]} is already charged in study "
                                              f"{entry.study_id!r}; reuse its charge")
            if total + entry.epsilon > Fraction(budget) * (1 + Fraction(EPSILON_TOLERANCE)):
                raise BudgetExhaustedError(f"study {entry.study_id!r}: the charge log spends {float(total):g} of "
                                           f"{float(budget):g}; {float(entry.epsilon):g} more does not fit "
                                           f"(holder {self.holder}'s check, nothing signed)")
            sig = self._key.sign(entry.statement())
            self._db.execute("INSERT INTO tofn_signed VALUES (?, ?, ?, ?, ?, ?)",
                             (entry.study_id, entry.index, entry.digest(), json.dumps(entry.to_dict()), sig,
                              utc_now()))
            return sig

    def authorize(self, study_id: str, request: str, log: Sequence[SignedCharge]) -> SignedCharge:
        """The valid charge of `request` in the study's whole `log`, if this holder is one of its participants.

        What a holder asks before it issues a share: refused (FailedPreconditionError) when the log is
        broken, omits a charge this holder signed, has no charge for the request, or the charge names
        other participants. The log becomes this holder's view of the study's spend (a holder that was
        down catches up here)."""
        with self._lock:
            self.rules.check_log(study_id, log)
            self._check_known(study_id, log)
            self._check_against_own(study_id, log, len(log))
            for charge in log:
                if charge.entry.request == request:
                    if self.holder not in charge.entry.participants:
                        raise FailedPreconditionError(
                            f"request {request[:12]} of study {study_id!r} is charged for holders "
                            f"{list(charge.entry.participants)}; holder {self.holder} is not one of them and issues "
                            "no share (the participant set is fixed by the charge)")
                    self._remember(study_id, log)
                    return charge
            raise FailedPreconditionError(f"request {request[:12]} has no charge with {self.rules.threshold} holder "
                                          f"signatures in the log of study {study_id!r}; nothing issued")

    def _check_known(self, study_id: str, log: Sequence[SignedCharge]) -> None:
        """Refuse a log that differs from the verified log this holder kept at a position both have: two valid
        charges at one position exist only if a holder signed both (more holders colluding with the CS than
        `budget_collusion_tolerance` allows), and this holder will not build on either branch."""
        rows = self._db.execute("SELECT idx, charge FROM tofn_log WHERE study_id = ? AND idx < ? ORDER BY idx",
                                (study_id, len(log))).fetchall()
        for idx, raw in rows:
            known = SignedCharge.from_dict(json.loads(raw)).entry
            if known.digest() != log[int(idx)].entry.digest():
                raise FailedPreconditionError(
                    f"holder {self.holder} refuses: charge {idx} of study {study_id!r} differs from the valid charge "
                    "it verified there before; two valid charges at one position mean a holder signed both "
                    "(collusion with the computation server): this study's charge log has forked")

    def _remember(self, study_id: str, log: Sequence[SignedCharge]) -> None:
        """Keep the longest verified log seen (`_check_known` ran first: it extends what is kept)."""
        have = int(self._db.execute("SELECT COUNT(*) FROM tofn_log WHERE study_id = ?", (study_id,)).fetchone()[0])
        for charge in log[have:]:
            self._db.execute("INSERT INTO tofn_log VALUES (?, ?, ?)",
                             (study_id, charge.entry.index, json.dumps(charge.to_dict())))

    def view(self, study_id: str) -> dict[str, Any]:
        """This holder's view of the study's spend: the verified log it knows and the charges it signed."""
        with self._lock:
            rows = self._db.execute("SELECT charge FROM tofn_log WHERE study_id = ? ORDER BY idx", (study_id,))
            log = [SignedCharge.from_dict(json.loads(r[0])) for r in rows.fetchall()]
            signed = sorted(self._signed(study_id))
        return {"holder": self.holder, "charges": len(log), "spent": chain_total(log), "signed": signed}


def log_epsilon(contract: StudyContract) -> Fraction:
    """What a t-of-N study's signed charge log may spend: the study's epsilon, less a join's padding epsilon (each
    holder charged that to its own ledger when the study opened, before any log entry)."""
    total = Fraction(contract.epsilon)
    if contract.is_join:
        total -= Fraction(contract.join_terms().padding_epsilon)
    return total
