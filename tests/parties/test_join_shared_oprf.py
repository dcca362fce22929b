"""Join pseudonyms with the OPRF key shared among 3 key-share holders (3-of-3 and 2-of-3): an owner's client gets the
single key's pseudonyms from any t holders, a holder down mid-way included; each holder books its own quota and log;
and an owner colluding with the computation server, routing pages through different pairs of holders to stretch
their quotas, recovers no more identifiers than its quota."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import grpc
import pytest

from he_partition.join import oprf, toprf
from he_partition.join.protocol import oprf_input
from parties.common.contract import StudyContract
from parties.common.errors import FailedPreconditionError, QuotaExhaustedError, ServiceError
from parties.common.sealing import SealKeyPair
from parties.data_owner.join_holders import shared_evaluations
from parties.decryption.keyshare.pseudonyms import SharedPseudonyms
from parties.decryption.oprf import EvaluationLog

#: Quota 8 per owner (6 declared records plus the dummies' allowance 2) in pages of 4: two page indices each.
TERMS = {"shape": [2, 2], "capacity": 8192, "padding_epsilon": 50.0, "padding_offset": 1, "pseudonyms": "oprf",
         "max_records": [6, 6]}
PAGE = 4


def _contract(seals: Sequence[SealKeyPair], threshold: int) -> StudyContract:
    return StudyContract.create(study_id="jk", domain_size=4, epsilon=3.0, expected_owners=("a", "b"),
                                context_fingerprint="ab" * 32, strategy="join", strategy_params=json.dumps(TERMS),
                                owner_keys={"a": "11" * 32, "b": "22" * 32},
                                holder_seal_keys=[s.public_hex for s in seals],
                                seal_threshold=0 if threshold == 3 else threshold)


class Holder:
    """Key-share holder `index` as an owner reaches it (its service in this process; `down`: unavailable)."""

    def __init__(self, service: SharedPseudonyms, contract: StudyContract) -> None:
        self.service, self.contract, self.down, self.pages = service, contract, False, 0

    def evaluate_shared(self, *, study_id: str, owner_id: str, contract_hash: str, page: int,
                        route: Sequence[int], elements: Sequence[bytes]) -> list[bytes]:
        if self.down:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "connection refused")
        self.pages += 1
        return self.service.evaluate(self.contract, owner_id=owner_id, contract_hash=contract_hash, page=page,
                                     route=route, elements=elements)[0]


def _holders(tmp_path: Path, threshold: int) -> tuple[list[Holder], bytes]:
    """Three holders with their own seal keys, master secrets and SQLite books; and the combined key (reference)."""
    seals = [SealKeyPair.load_or_create(tmp_path / f"h{i}") for i in range(3)]
    contract = _contract(seals, threshold)
    peers = {i: s.public for i, s in enumerate(seals)}
    services = [SharedPseudonyms(i, 3, threshold, bytes([i + 1]) * 32, seals[i], peers,
                                 EvaluationLog(tmp_path / f"h{i}" / "oprf.sqlite3"), page_elements=PAGE)
                for i in range(3)]
    key = toprf.combined_key([s.key(contract) for s in services])
    return [Holder(s, contract) for s in services], key


@pytest.mark.parametrize("threshold", [3, 2])
def test_an_owner_gets_the_single_key_pseudonyms_from_t_holders_each_booking_its_page(tmp_path: Path,
                                                                                     threshold: int) -> None:
    holders, key = _holders(tmp_path, threshold)
    contract = holders[0].contract
    inputs = [oprf_input(f"cust-{i}@example.org") for i in range(6)]
    blinds = oprf.blind_scalars(b"o" * 32, len(inputs))
    blinded = toprf.blind(inputs, blinds)
    if threshold == 2:
        holders[1].down = True  # down before the owner starts: every page goes to holders 0 and 2
    out = toprf.finalize(inputs, blinds, shared_evaluations(holders, contract, "a", blinded, page_elements=PAGE))
    assert out == [oprf.evaluate(key, x) for x in inputs]  # the single key holder's pseudonyms under k
    answered = [0, 2] if threshold == 2 else [0, 1, 2]
    for i in answered:  # each holder booked both pages in its own log, within the owner's quota
        rows = holders[i].service.evaluations.rows("jk")
        assert [(r.owner_id, r.page, r.elements) for r in rows] == [("a", 0, 4), ("a", 1, 2)]
    if threshold == 2:
        assert holders[1].service.evaluations.rows("jk") == []
        holders[1].down = False  # a re-run on another route: holder 0 answers the same pages again, books nothing
        holders[2].down = True
        again = toprf.finalize(inputs, blinds, shared_evaluations(holders, contract, "a", blinded, page_elements=PAGE))
        assert again == out and holders[0].service.evaluations.used("jk", "a") == 6
        holders[0].down = True
        with pytest.raises(FailedPreconditionError, match="1 of its 3 key holders are up, its pseudonyms need 2"):
            shared_evaluations(holders, contract, "a", blinded, page_elements=PAGE)
    # The contract's form and seal keys are the holders' own, nothing else: another form is refused by name.
    other = _contract([SealKeyPair.load_or_create(tmp_path / f"h{i}") for i in range(3)], 5 - threshold)
    with pytest.raises(FailedPreconditionError, match="shares its keys"):
        holders[0].service.evaluate(other, owner_id="a", contract_hash=other.contract_hash, page=0, route=(0, 1, 2),
                                    elements=blinded[:1])


def test_an_owner_colluding_with_the_cs_routing_pages_through_other_pairs_recovers_no_more_than_its_quota(
        tmp_path: Path) -> None:
    """The dictionary attack at 2-of-3: owner a (quota 8: two pages of 4) and the computation server send three
    pages of guesses through the three pairs of holders, each holder answering two. With per-holder quotas alone
    that evaluates 12 guesses (3q/2); the route masks and the page positions leave at most 8."""
    holders, key = _holders(tmp_path, 2)
    contract = holders[0].contract
    b_list = {oprf.evaluate(key, oprf_input(f"cust-{i}@example.org")) for i in range(12)}  # b's pseudonyms
    guesses = [oprf_input(f"cust-{i}@example.org") for i in range(12)]
    blinds = oprf.blind_scalars(b"a" * 32, 12)
    blinded = toprf.blind(guesses, blinds)
    pages = [blinded[0:4], blinded[4:8], blinded[8:12]]

    def ask(holder: int, page: int, route: tuple[int, int], elements: list[bytes]) -> list[bytes] | None:
        try:
            return holders[holder].service.evaluate(contract, owner_id="a", contract_hash=contract.contract_hash,
                                                    page=page, route=route, elements=elements)[0]
        except (FailedPreconditionError, QuotaExhaustedError):
            return None

    # The plan that gets 3q/2 from per-holder quotas: A on holders 0, 1 at page 0; B on 0, 2 at page 1; C on 1, 2,
    # at the page each has left (1 at holder 1, 0 at holder 2). Every holder answers: each stays within its quota.
    plan = [((0, 1), {0: 0, 1: 0}), ((0, 2), {0: 1, 2: 1}), ((1, 2), {1: 1, 2: 0})]
    combined = []
    for which, (route, page_of) in enumerate(plan):
        got = [ask(h, page_of[h], route, pages[which]) for h in route]
        assert all(g is not None for g in got), which
        combined.append(toprf.combine(got))  # type: ignore[arg-type]
    # Anything else for C (another page, a route that names another holder): refused, quota or page taken.
    for h, page, route in ((1, 0, (1, 2)), (2, 1, (1, 2)), (0, 0, (0, 1)), (0, 2, (0, 2)), (2, 2, (0, 2))):
        assert ask(h, page, route, pages[2]) is None
    recovered = [set(toprf.finalize(guesses[4 * w:4 * w + 4], blinds[4 * w:4 * w + 4], combined[w])) & b_list
                 for w in range(3)]
    assert [len(r) for r in recovered] == [4, 4, 0]  # C's answers came from two pages: their masks do not cancel
    quota = contract.join_terms().evaluation_quota(0)
    assert quota == 8 and sum(len(r) for r in recovered) <= quota
    assert all(h.service.evaluations.used("jk", "a") <= quota for h in holders)
    # A page past the quota's positions is refused by name, whatever its size.
    with pytest.raises(QuotaExhaustedError, match="ends past it"):
        holders[2].service.evaluate(contract, owner_id="a", contract_hash=contract.contract_hash, page=2,
                                    route=(1, 2), elements=pages[2][:1])


def test_a_holders_oprf_secret_created_by_two_first_pages_at_once_is_one_secret(tmp_path: Path) -> None:
    """Two owners' first pages reach a fresh holder at once: both must be answered under one master secret, or
    their pseudonyms never match (a join of two owners then releases an empty table). Eight calls race here."""
    import threading

    from parties.decryption.keys import load_or_create_secret

    for round_ in range(5):
        folder = tmp_path / f"keys{round_}"
        start = threading.Barrier(8)
        got: list[bytes] = []

        def run(start: threading.Barrier, got: list[bytes], folder: Path) -> None:
            start.wait()
            got.append(load_or_create_secret(folder, "oprf_key.bin", "oprf key"))

        threads = [threading.Thread(target=run, args=(start, got, folder)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 8 and set(got) == {(folder / "oprf_key.bin").read_bytes()}
        assert sorted(p.name for p in folder.iterdir()) == ["oprf_key.bin"]  # no stray temporary file
