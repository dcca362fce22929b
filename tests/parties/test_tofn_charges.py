"""The t-of-N charge chain against a computation server that routes requests to any holders it likes.

The attacker doubles: a CS that tries every routing of requests to the three pairs of holders
(K = 3, t = 2), with replays, omitted and truncated logs and forks; and a CS colluding with one
holder, which the chain cannot stop at K = 3, t = 2 (the documented limit) but does stop at
K = 4, t = 3. The first double also runs against per-holder ledgers (each holder charging only
what it is asked, as N-of-N holders do), which it overspends: that is why the chain exists.
"""
from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from he_partition.core.errors import BudgetExhaustedError, DPAggError
from parties.decryption.keyshare.charges import (GENESIS, ChargeBook, ChargeEntry, ChargeRules, SignedCharge,
                                                 budget_collusion_tolerance)
from parties.common.errors import FailedPreconditionError

STUDY = "s1"
BUDGET = Fraction(1)
EPS = Fraction(2, 5)  # two charges fit in the budget, three do not


def _keys(n: int) -> tuple[dict[int, bytes], dict[int, bytes]]:
    private, public = {}, {}
    for h in range(n):
        k = Ed25519PrivateKey.generate()
        private[h] = k.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                     serialization.NoEncryption())
        public[h] = k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, public


def _books(n: int, t: int, tmp: Path | None = None) -> tuple[dict[int, ChargeBook], ChargeRules, dict[int, bytes]]:
    private, public = _keys(n)
    rules = ChargeRules(public, t)
    books = {h: ChargeBook(h, private[h], rules, (tmp / f"h{h}.sqlite3") if tmp else None) for h in range(n)}
    return books, rules, private


class RoutingCS:
    """A deviating computation server: it keeps every signature it ever got and builds any log it can."""

    def __init__(self, books: dict[int, ChargeBook], rules: ChargeRules) -> None:
        self.books, self.rules = books, rules
        self.sigs: dict[str, SignedCharge] = {}  # entry digest -> the entry with every signature gathered
        self.shares: set[tuple[str, int]] = set()  # (request, holder) shares it was authorized to get
        self._valid: dict[tuple[str, int], bool] = {}

    def valid(self) -> list[SignedCharge]:
        out = []
        for digest, c in self.sigs.items():
            key = (digest, len(c.signatures))
            if key not in self._valid:
                self._valid[key] = self.rules.valid(c)
            if self._valid[key]:
                out.append(c)
        return out

    def chains(self) -> list[list[SignedCharge]]:
        """Every chain of valid entries it holds (from genesis), prefixes included."""
        out: list[list[SignedCharge]] = [[]]
        frontier: list[list[SignedCharge]] = [[]]
        while frontier:
            nxt = []
            for chain in frontier:
                prev = chain[-1].entry.digest() if chain else GENESIS
                for c in self.valid():
                    if c.entry.previous == prev and c.entry.index == len(chain):
                        nxt.append(chain + [c])
            out += nxt
            frontier = nxt
        return out

    def ask_sign(self, holders: Sequence[int], entry: ChargeEntry, log: Sequence[SignedCharge]) -> None:
        for h in holders:
            try:
                sig = self.books[h].sign(entry, log, BUDGET)
            except DPAggError:
                continue
            got = self.sigs.get(entry.digest(), SignedCharge(entry))
            self.sigs[entry.digest()] = got.with_signature(h, sig)

    def ask_share(self, holders: Sequence[int], request: str, log: Sequence[SignedCharge]) -> None:
        for h in holders:
            try:
                self.books[h].authorize(STUDY, request, log)
            except DPAggError:
                continue
            self.shares.add((request, h))

    def released(self) -> Fraction:
        """Epsilon of every request for which it could gather t shares (what it could decrypt)."""
        total = Fraction(0)
        for c in self.valid():
            if sum((c.entry.request, h) in self.shares for h in c.entry.participants) >= self.rules.threshold:
                total += c.entry.epsilon
        return total

    def spent_chain_ok(self) -> None:
        """Every valid entry lies on one chain, and that chain's total is within the budget."""
        valid = self.valid()
        by_index: dict[int, set[str]] = {}
        for c in valid:
            by_index.setdefault(c.entry.index, set()).add(c.entry.digest())
        assert all(len(v) == 1 for v in by_index.values()), "two valid charges at one position"
        assert sum((c.entry.epsilon for c in valid), Fraction(0)) <= BUDGET

    def one_request(self, request: str, pair: tuple[int, ...], log_choice: int, sign_with: Sequence[int]) -> None:
        """Propose `request` for participants `pair` on top of one of the chains it holds (log_choice picks which,
        and a truncation of it), signed by `sign_with`, then ask the pair for shares with every chain it holds."""
        chains = self.chains()
        log = chains[log_choice % len(chains)]
        entry = ChargeEntry(STUDY, len(log), log[-1].entry.digest() if log else GENESIS, request, EPS, pair)
        self.ask_sign(sign_with, entry, log)
        for chain in self.chains():
            self.ask_share(pair, request, chain)


PAIRS = [(0, 1), (1, 2), (0, 2)]


def test_every_routing_of_three_requests_stays_within_the_budget() -> None:
    """Every order of three requests over the pairs {1,2}, {2,3}, {1,3} (27 routings), each proposed on every log
    the CS holds (full, truncated, empty: replays and omitted receipts), signed by the pair or by the third holder
    as well: the CS never decrypts more than the budget, and the valid charges form one chain."""
    for routing in itertools.product(PAIRS, repeat=3):
        for choices in itertools.product(range(3), repeat=3):
            books, rules, _ = _books(3, 2)
            cs = RoutingCS(books, rules)
            for n, (pair, choice) in enumerate(zip(routing, choices)):
                cs.one_request(f"r{n}", pair, choice, sign_with=[0, 1, 2] if choice == 2 else list(pair))
                cs.one_request(f"r{n}", pair, choice + 1, sign_with=list(pair))  # a replay of the same request
            cs.spent_chain_ok()
            assert cs.released() <= BUDGET, (routing, choices)
            for b in books.values():
                b.close()


class PerHolderBook(ChargeBook):
    """A holder that keeps only its own ledger (N-of-N style): it signs while its own charges fit the budget and
    issues a share for any charge with t signatures, whatever log it is shown."""

    def sign(self, entry: ChargeEntry, log: Sequence[SignedCharge], budget: Fraction) -> bytes:
        mine = sum((Fraction(r[0]) for r in self._db.execute("SELECT json_extract(entry, '$.epsilon') FROM "
                                                               "tofn_signed").fetchall()), Fraction(0))
        if mine + entry.epsilon > budget:
            raise BudgetExhaustedError("own ledger spent")
        sig = self._key.sign(entry.statement())
        self._db.execute("INSERT OR IGNORE INTO tofn_signed VALUES (?, ?, ?, ?, ?, '')",
                         (entry.study_id, entry.index, entry.digest(), json.dumps(entry.to_dict()), sig))
        return sig

    def authorize(self, study_id: str, request: str, log: Sequence[SignedCharge]) -> SignedCharge:
        for c in log:
            if c.entry.request == request and self.holder in c.entry.participants and self.rules.valid(c):
                return c
        raise FailedPreconditionError("no charge")


def test_the_routing_double_overspends_per_holder_ledgers() -> None:
    """The same routings against holders that each keep their own ledger: the CS decrypts 1.2 on a budget of 1
    (so the double can tell a broken rule from a sound one), while against the chain it gets exactly the budget's
    two charges."""
    worst, best_sound = Fraction(0), Fraction(0)
    for routing in itertools.product(PAIRS, repeat=3):
        for cls in (PerHolderBook, ChargeBook):
            private, public = _keys(3)
            rules = ChargeRules(public, 2)
            books = {h: cls(h, private[h], rules) for h in range(3)}
            cs = RoutingCS(books, rules)
            for n, pair in enumerate(routing):
                cs.one_request(f"r{n}", pair, 99, sign_with=list(pair))
            if cls is PerHolderBook:
                worst = max(worst, cs.released())
            else:
                best_sound = max(best_sound, cs.released())
    assert worst == 3 * EPS > BUDGET
    assert best_sound == 2 * EPS


def test_a_random_deviating_cs_never_overspends() -> None:
    """500 random attack runs: random positions, predecessors, participant sets, logs (any chain it holds, any
    prefix of it, or one with an entry left out) and holders asked."""
    rng = random.Random(7)
    for run in range(500):
        books, rules, _ = _books(3, 2)
        cs = RoutingCS(books, rules)
        for _step in range(8):
            chains = cs.chains()
            log = list(rng.choice(chains))
            if log and rng.random() < 0.3:
                del log[rng.randrange(len(log))]  # an omitted receipt
            prev_choices = [GENESIS] + [c.entry.digest() for c in cs.sigs.values()]
            entry = ChargeEntry(STUDY, rng.randrange(4), rng.choice(prev_choices), f"r{rng.randrange(5)}", EPS,
                                rng.choice(PAIRS))
            cs.ask_sign(rng.sample(range(3), rng.randint(1, 3)), entry, log)
            cs.ask_share(rng.sample(range(3), rng.randint(1, 3)), entry.request, rng.choice(cs.chains()))
        cs.spent_chain_ok()
        assert cs.released() <= BUDGET, run


def test_per_holder_ledgers_are_overspent_by_routing() -> None:
    """Without the chain (each holder charging its own ledger for what it is asked, as N-of-N holders do), the
    routing {1,2}, {2,3}, {1,3} releases three charges of 0.4 on a budget of 1: each holder saw only two."""
    ledgers = {h: Fraction(0) for h in range(3)}
    released = Fraction(0)
    for pair in PAIRS:
        if all(ledgers[h] + EPS <= BUDGET for h in pair):
            for h in pair:
                ledgers[h] += EPS
            released += EPS
    assert released == 3 * EPS > BUDGET


def test_a_holder_that_was_down_catches_up_and_refuses_an_omitting_log(tmp_path: Path) -> None:
    books, rules, _ = _books(3, 2, tmp_path)
    cs = RoutingCS(books, rules)
    cs.one_request("r0", (0, 1), 0, sign_with=[0, 1])  # holder 2 is down
    cs.one_request("r1", (0, 1), 99, sign_with=[0, 1])
    full = max(cs.chains(), key=len)
    assert len(full) == 2
    # holder 2 comes back: a request with participants {0, 2}; holder 0 refuses a log that omits what it signed
    entry = ChargeEntry(STUDY, 0, GENESIS, "r2", EPS, (0, 2))
    with pytest.raises(FailedPreconditionError, match="omits charge 1"):
        books[0].sign(entry, [], BUDGET)
    entry = ChargeEntry(STUDY, 2, full[-1].entry.digest(), "r2", EPS, (0, 2))
    with pytest.raises(BudgetExhaustedError, match="spends 0.8 of 1"):
        books[2].sign(entry, full, BUDGET)  # holder 2 had signed nothing, yet the log tells it the spend
    assert books[2].view(STUDY)["spent"] == Fraction(4, 5)  # caught up from the log it checked
    # a holder that is not a participant of a charge issues no share for it
    with pytest.raises(FailedPreconditionError, match="not one of them"):
        books[2].authorize(STUDY, "r0", full)
    with pytest.raises(FailedPreconditionError, match="no charge"):
        books[0].authorize(STUDY, "r9", full)
    # the book survives a restart: holder 0 still refuses a second entry at position 0
    books[0].close()
    reopened = ChargeBook(0, _[0], rules, tmp_path / "h0.sqlite3")
    with pytest.raises(FailedPreconditionError, match="another charge at position 1"):
        reopened.sign(ChargeEntry(STUDY, 1, full[0].entry.digest(), "r3", EPS, (0, 2)), full[:1], BUDGET)


def test_a_signature_from_an_unknown_key_or_a_forged_one_counts_for_nothing() -> None:
    books, rules, private = _books(3, 2)
    entry = ChargeEntry(STUDY, 0, GENESIS, "r0", EPS, (0, 1))
    sig0 = books[0].sign(entry, [], BUDGET)
    stranger = Ed25519PrivateKey.generate().sign(entry.statement())
    forged = SignedCharge(entry, {0: sig0, 1: stranger, 7: stranger})
    assert rules.signers(forged) == [0] and not rules.valid(forged)
    with pytest.raises(FailedPreconditionError, match="1 valid holder signatures"):
        books[2].authorize(STUDY, "r0", [forged])


def test_collusion_limit_k3_t2_and_k4_t3() -> None:
    """The CS with holder 1 as accomplice (it signs anything) forks the K = 3, t = 2 chain: {1, 0} and {1, 2} each
    sign a different charge at every position, so the budget is spent once per honest holder. At K = 4, t = 3 the
    same accomplice gets nowhere: two 3-sets share two holders, one of them honest."""
    assert budget_collusion_tolerance(3, 2) == 0 and budget_collusion_tolerance(4, 3) == 1
    for n, t, accomplice in ((3, 2, 1), (4, 3, 1)):
        books, rules, private = _books(n, t)
        honest = [h for h in range(n) if h != accomplice]
        acc_key = Ed25519PrivateKey.from_private_bytes(private[accomplice])
        branches: list[list[SignedCharge]] = [[] for _ in honest]
        for step in range(3):
            for b, h in enumerate(honest):
                log = branches[b]
                others = [x for x in honest if x != h][:t - 2]  # fill a t-set with the accomplice and honest holders
                pset = tuple(sorted([h, accomplice, *others]))
                entry = ChargeEntry(STUDY, len(log), log[-1].entry.digest() if log else GENESIS, f"b{b}-{step}", EPS,
                                    pset)
                sc = SignedCharge(entry, {accomplice: acc_key.sign(entry.statement())})
                for x in (h, *others):
                    try:
                        sc = sc.with_signature(x, books[x].sign(entry, log, BUDGET))
                    except DPAggError:
                        pass
                if rules.valid(sc):
                    branches[b] = log + [sc]
        total = sum((c.entry.epsilon for br in branches for c in br), Fraction(0))
        if t == 2:
            assert total == 2 * 2 * EPS > BUDGET  # two branches of two charges each: the documented limit
        else:
            assert total <= BUDGET


@pytest.mark.parametrize("text", ["[1]", "[[]]", '[{"entry": 3, "signatures": {}}]', '[{"signatures": 5}]', "{}",
                                  '[{"entry": {"index": "x"}, "signatures": {}}]', "nonsense"])
def test_a_malformed_log_is_refused_as_bad_input(text: str) -> None:
    from he_partition.core.errors import InvalidInputError
    from parties.decryption.keyshare.charges import load_log

    with pytest.raises(InvalidInputError):
        load_log(text)


def test_the_failover_moves_decrypt_nothing_twice_without_a_second_charge() -> None:
    """The failover double: request r is charged for (h1, h2) and h2 is lost. The CS then asks h1 and h3 for r's
    shares on every log it holds, and proposes r again for (h1, h3) at every position of every log: h3 is never
    authorized for r and no second entry for r becomes valid. Only a request of its own (the honest failover's
    charge) gets (h1, h3) their shares, and it is charged in the log; a second failover past the budget is not."""
    books, rules, _ = _books(3, 2)
    cs = RoutingCS(books, rules)
    cs.one_request("r", (0, 1), 0, [0, 1])
    for chain in cs.chains():
        cs.ask_share((0, 2), "r", chain)
        for pos in range(len(chain) + 1):
            log = chain[:pos]
            entry = ChargeEntry(STUDY, pos, log[-1].entry.digest() if log else GENESIS, "r", EPS, (0, 2))
            cs.ask_sign((0, 1, 2), entry, log)
    assert ("r", 2) not in cs.shares
    assert [c.entry.participants for c in cs.valid() if c.entry.request == "r"] == [(0, 1)]
    assert cs.released() == EPS
    cs.spent_chain_ok()
    cs.one_request("r.fo1", (0, 2), -1, [0, 2])  # the failover's own charge, on the whole log
    assert {("r.fo1", 0), ("r.fo1", 2)} <= cs.shares and cs.released() == 2 * EPS
    cs.one_request("r.fo2", (1, 2), -1, [1, 2])  # a third decryption of the measurement: past the budget
    assert cs.released() == 2 * EPS
    cs.spent_chain_ok()


def test_one_view_of_what_is_left_is_exact_and_a_failed_release_holds_nothing() -> None:
    """`log_budget` (the t-of-N view every reader uses) and `exact_text` keep decimals exact, and a holder's own
    ledger with a t-of-N key (`check_charge(reserve=False)`) refuses nothing for a failed release's reservation
    while it still refuses any spend past the total."""
    from parties.decryption.keyshare.charges import charge_epsilon, exact_text, log_budget
    from parties.decryption.ledger.budget import Charge, check_charge

    log = [SignedCharge(ChargeEntry(STUDY, i, "", f"q{i}", charge_epsilon(e), (0, 1))) for i, e in
           enumerate([0.1, 0.2, 0.3])]
    view = log_budget(1.0, log, Fraction(1, 10))
    assert view.spent == Fraction(3, 5) and view.reserved == Fraction(7, 10) and view.available == Fraction(3, 10)
    assert [exact_text(x) for x in (view.spent, view.available, 0.1 + 0.2, Fraction(1, 3))] == \
        ["0.6", "0.3", "0.3", "0.333333333333"]
    assert exact_text(Fraction(1) - Fraction(repr(0.1)) - Fraction(repr(0.8))) == "0.1"  # not 0.09999999999999998
    failed = [Charge(1, STUDY, "rel-failed", "partition_sums", 0.1, 0.5, "")]  # declared 0.5, charged 0.1
    with pytest.raises(BudgetExhaustedError, match="0.5 left of 1"):  # a reservation the failed release keeps
        check_charge(1.0, failed, "rel-next", 0.3, 0.9)
    assert check_charge(1.0, failed, "rel-next", 0.3, 0.9, reserve=False) == 0.3  # the log is the check
    with pytest.raises(BudgetExhaustedError, match="total"):
        check_charge(1.0, failed, "rel-next", 0.95, 0.95, reserve=False)
