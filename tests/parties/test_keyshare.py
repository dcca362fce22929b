"""Key-share holders deciding alone: real SEAL (K = 3), real SQLite ledgers, one file per holder."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.core.noise import laplace_scale
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.threshold.decrypt import combine
from he_partition.he.threshold.wire import ciphertext_digest
from parties.common.contract import StudyContract
from parties.common.errors import FailedPreconditionError
from parties.decryption.keyshare.holder import ShareRequest, ThresholdHolder
from parties.decryption.ledger import backup_ledger
from tests.he_partition.test_threshold import HOLDERS, _encrypted_sum, _rows, make_setup

T = 562949952847873
SLOTS = 500


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    return make_setup()


def _contract(fp: bytes, epsilon: float = 1.0, tolerates: int = 0) -> StudyContract:
    return StudyContract(study_id="thr", domain_size=SLOTS, epsilon=epsilon, expected_owners=("a", "b"),
                         context_fingerprint=fp.hex(), strategy="hier", noise_tolerates=tolerates)


def _holders(s: dict[str, Any], tmp: Path, contract: StudyContract) -> dict[int, ThresholdHolder]:
    out = {}
    for h in HOLDERS:
        out[h] = ThresholdHolder(s["ctx"], s["secrets"][h], len(HOLDERS), s["fp"], bytes([h + 1]) * 32,
                                 tmp / f"holder{h}.sqlite")
        out[h].register_study(contract)
    return out


def _request(s: dict[str, Any], contract: StudyContract, ct: bytes, release: str = "r1",
             epsilon: float = 1.0) -> ShareRequest:
    return ShareRequest(study_id=contract.study_id, contract_hash=contract.contract_hash, release_id=release,
                        release_epsilon=epsilon, kind="partition_sums", epsilon=epsilon, sensitivity=1, slots=SLOTS,
                        key_fingerprint=s["fp"], ciphertext=ct)


@pytest.mark.parametrize("tolerates", [0, 2])
def test_three_holders_release_data_plus_one_discrete_laplace_and_charge_their_own_ledgers(
        setup: dict[str, Any], tmp_path: Path, tolerates: int) -> None:
    """T = 0: the three shares sum to one discrete Laplace draw; T = 2 (noise_tolerates K - 1): each share is drawn
    for K - T = 1 holder, a full draw of its own."""
    contract = _contract(setup["fp"], tolerates=tolerates)
    holders = _holders(setup, tmp_path, contract)
    rows = _rows(3, 21)
    ct = _encrypted_sum(setup, rows)
    req = _request(setup, contract, ct)
    shares = [holders[h].request_share(req) for h in HOLDERS]
    got = combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])
    label = b"dp/" + req.label(ciphertext_digest(ct))
    noise = sum(discrete_laplace_share(laplace_scale(1, 1.0), 3 - tolerates, SLOTS,
                                       holder_noise_source(bytes([h + 1]) * 32, h, 3, label)) for h in HOLDERS)
    expected = np.sum(np.array(rows, dtype=np.int64), axis=0)
    expected[:SLOTS] += noise
    assert got[:SLOTS].tolist() == (expected[:SLOTS] % T).tolist() and np.count_nonzero(noise) > SLOTS // 3
    # the unmeasured slots carry the holders' pads, not the data (the combiner knows the CS's pads)
    assert np.count_nonzero(got[SLOTS:] == expected[SLOTS:] % T) < 5 and len(got) > SLOTS
    for h in HOLDERS:
        charges = holders[h].ledger.charges("thr")
        assert [(c.release_id, c.epsilon) for c in charges] == [("r1", 1.0)]


def test_a_study_tolerating_k_or_more_colluders_is_refused_naming_noise_tolerates_and_k(
        setup: dict[str, Any], tmp_path: Path) -> None:
    holder = ThresholdHolder(setup["ctx"], setup["secrets"][0], len(HOLDERS), setup["fp"], b"\x01" * 32,
                             tmp_path / "holder0.sqlite")
    with pytest.raises(FailedPreconditionError, match=r"noise_tolerates is 3 but there are K = 3"):
        holder.register_study(_contract(setup["fp"], tolerates=3))
    assert holder.ledger.list_studies() == []


def test_one_holder_with_an_exhausted_ledger_means_no_decryption(setup: dict[str, Any], tmp_path: Path) -> None:
    contract = _contract(setup["fp"])
    holders = _holders(setup, tmp_path, contract)
    holders[2].ledger.charge("thr", "earlier", "partition_sums", 1.0, 1.0)  # holder 2's view: budget spent
    ct = _encrypted_sum(setup, _rows(1, 22), flood=False)
    req = _request(setup, contract, ct)
    shares = [holders[h].request_share(req) for h in (0, 1)]
    with pytest.raises(BudgetExhaustedError, match="nothing was decrypted"):
        holders[2].request_share(req)
    with pytest.raises(InvalidInputError, match="missing decryption share from holder 2"):
        combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])


def test_a_rolled_back_ledger_cannot_make_the_study_overspend(setup: dict[str, Any], tmp_path: Path) -> None:
    contract = _contract(setup["fp"])
    holders = _holders(setup, tmp_path, contract)
    old = tmp_path / "holder0-old.sqlite"
    backup_ledger(tmp_path / "holder0.sqlite", old)  # holder 0's ledger before the study spent anything
    ct1 = _encrypted_sum(setup, _rows(1, 23), flood=False)
    first = {h: holders[h].request_share(_request(setup, contract, ct1)) for h in HOLDERS}
    holders[0].close()
    rolled = ThresholdHolder(setup["ctx"], setup["secrets"][0], 3, setup["fp"], bytes([1]) * 32, old)
    ct2 = _encrypted_sum(setup, _rows(1, 24), flood=False)
    req2 = _request(setup, contract, ct2, release="r2")
    shares = [rolled.request_share(req2)]  # the rolled-back holder thinks the budget is unspent
    for h in (1, 2):
        with pytest.raises(BudgetExhaustedError):
            holders[h].request_share(req2)
    with pytest.raises(InvalidInputError, match="missing decryption share from holder 1"):
        combine(setup["ctx"], ct2, shares, HOLDERS, setup["fp"])
    # its share table rolled back too, yet asked again for the first ciphertext it issues the identical bytes:
    # no second, independent share of one ciphertext to average
    with pytest.raises(BudgetExhaustedError):  # r2 holds the rolled-back ledger's whole budget now
        rolled.request_share(_request(setup, contract, ct1))
    fresh = ThresholdHolder(setup["ctx"], setup["secrets"][0], 3, setup["fp"], bytes([1]) * 32,
                            tmp_path / "empty.sqlite")
    fresh.register_study(contract)
    assert fresh.request_share(_request(setup, contract, ct1)) == first[0]


def test_duplicate_requests_get_the_stored_share_or_a_refusal(setup: dict[str, Any], tmp_path: Path) -> None:
    contract = _contract(setup["fp"], epsilon=2.0)
    holders = _holders(setup, tmp_path, contract)
    ct = _encrypted_sum(setup, _rows(1, 25), flood=False)
    req = _request(setup, contract, ct)
    once = holders[0].request_share(req)
    assert holders[0].request_share(req) == once  # the retry: same bytes, charged once
    assert [c.epsilon for c in holders[0].ledger.charges("thr")] == [1.0]
    with pytest.raises(FailedPreconditionError, match="already issued for this ciphertext under another request"):
        holders[0].request_share(_request(setup, contract, ct, release="r2"))  # a second, independent DP share
    assert [c.epsilon for c in holders[0].ledger.charges("thr")] == [1.0]


def test_requests_off_the_contract_are_refused_before_any_charge(setup: dict[str, Any], tmp_path: Path) -> None:
    contract = _contract(setup["fp"])
    holders = _holders(setup, tmp_path, contract)
    ct = _encrypted_sum(setup, _rows(1, 26), flood=False)
    other = _contract(bytes(32))
    with pytest.raises(FailedPreconditionError, match="not this holder's collective key"):
        holders[0].register_study(other)
    good = _request(setup, contract, ct)
    bad = [
        (good.__class__(**{**good.__dict__, "key_fingerprint": bytes(32)}), "not under this holder's collective key", FailedPreconditionError),
        (good.__class__(**{**good.__dict__, "contract_hash": "0" * 64}), "contract hash differs", FailedPreconditionError),
        (good.__class__(**{**good.__dict__, "kind": "haar_coefficients"}), "not used by study thr's strategy", FailedPreconditionError),
        (good.__class__(**{**good.__dict__, "sensitivity": 0}), "sensitivity must be an integer >= ", InvalidInputError),
        (good.__class__(**{**good.__dict__, "epsilon": 2.0}), "need 0 < measurement epsilon 2.0", InvalidInputError),
        (good.__class__(**{**good.__dict__, "slots": 9000}), "measured slots must be in", InvalidInputError),
    ]
    for req, msg, error in bad:
        with pytest.raises(error, match=msg):
            holders[0].request_share(req)
    assert holders[0].ledger.charges("thr") == []
