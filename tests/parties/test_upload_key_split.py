"""Upload keys split t-of-N (parties.common.key_split, sealing): any t holders' shares give the key, fewer say nothing
of it, and no two sets of t holders close a study's uploads on two different sets of owners."""
from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.contract import StudyContract
from parties.common.convert import contract_from_proto, contract_to_proto
from parties.common.errors import FailedPreconditionError
from parties.common.key_split import PRIME, SHARE_BYTES, combine_key
from parties.common.sealing import (Commitment, SealKeyPair, commitment_statement, seal_upload_key, sealed_key_shares,
                                    upload_key_from_shares, upload_key_from_threshold_shares)
from parties.common.signing import generate_signing_key, sign_submission
from parties.decryption.commitments import CommitmentBook

PLACE: dict[str, Any] = dict(study_id="s1", owner_id="a", idempotency_key="k", contract_hash="0" * 64)


def _is_probable_prime(n: int) -> bool:
    """Miller-Rabin with 40 fixed bases (a composite passes with probability below 4^-40)."""
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in random.Random(5).sample(range(2, 10**6), 40):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def test_the_field_is_prime_and_holds_every_32_byte_key() -> None:
    assert _is_probable_prime(PRIME) and PRIME > 2**256 and PRIME.bit_length() <= 8 * SHARE_BYTES
    assert not any(_is_probable_prime(2**256 + d) for d in range(1, 297, 2))  # the least prime above 2^256


@pytest.mark.parametrize("t, n", [(2, 3), (3, 5), (3, 4)])
def test_any_t_shares_give_the_upload_key_and_fewer_are_refused(t: int, n: int) -> None:
    holders = [SealKeyPair.load_or_create(None) for _ in range(n)]
    key = seal_upload_key(b"\1" * 32, b"\2" * 32, **PLACE)
    blobs = sealed_key_shares(key, [h.public_hex for h in holders], threshold=t, **PLACE)
    assert blobs == sealed_key_shares(key, [h.public_hex for h in holders], threshold=t, **PLACE)  # a retry seals alike
    shares = {j: h.open_share(b, j, **PLACE) for j, (h, b) in enumerate(zip(holders, blobs))}
    assert all(len(s) == SHARE_BYTES for s in shares.values())
    for subset in itertools.combinations(range(n), t):
        assert upload_key_from_threshold_shares({j: shares[j] for j in subset}, t) == key
    assert upload_key_from_threshold_shares(shares, t) == key  # all N agree
    for subset in itertools.combinations(range(n), t - 1):
        with pytest.raises(InvalidInputError, match=f"at least {t} are needed"):
            upload_key_from_threshold_shares({j: shares[j] for j in subset}, t)
    with pytest.raises(InvalidInputError, match="does not open"):  # holder 1's share is not holder 0's to open
        holders[0].open_share(blobs[1], 0, **PLACE)


def test_t_minus_1_shares_are_consistent_with_every_key() -> None:
    """Shamir's secrecy, concretely: with t - 1 = 2 of a 3-of-5 key's shares fixed, every candidate key (the true one
    among them) has exactly one polynomial of degree 2 through it and those shares, and so one value for a third
    share; the two shares alone rule no key out."""
    holders = [SealKeyPair.load_or_create(None) for _ in range(5)]
    key = seal_upload_key(b"\7" * 32, b"\2" * 32, **PLACE)
    blobs = sealed_key_shares(key, [h.public_hex for h in holders], threshold=3, **PLACE)
    known = {j: holders[j].open_share(blobs[j], j, **PLACE) for j in (1, 3)}
    rng = random.Random(3)
    for candidate in [key] + [rng.randbytes(32) for _ in range(20)]:
        # the third share that completes (x = 0 -> candidate, the two known shares) to a polynomial, at holder 4
        pts = {0: int.from_bytes(candidate, "big"), 2: int.from_bytes(known[1], "big"),
               4: int.from_bytes(known[3], "big")}
        x, y = 5, 0
        for xj, yj in pts.items():
            num = den = 1
            for xm in pts:
                if xm != xj:
                    num, den = num * (x - xm) % PRIME, den * (xj - xm) % PRIME
            y = (y + yj * num * pow(den, -1, PRIME)) % PRIME
        completed = {**known, 4: y.to_bytes(SHARE_BYTES, "big")}
        assert combine_key(completed, 3) == candidate


def test_shares_that_disagree_or_are_malformed_are_refused() -> None:
    holders = [SealKeyPair.load_or_create(None) for _ in range(3)]
    key = seal_upload_key(b"\1" * 32, b"\2" * 32, **PLACE)
    blobs = sealed_key_shares(key, [h.public_hex for h in holders], threshold=2, **PLACE)
    shares = {j: h.open_share(b, j, **PLACE) for j, (h, b) in enumerate(zip(holders, blobs))}
    bad = dict(shares)
    bad[2] = (int.from_bytes(bad[2], "big") ^ 1).to_bytes(SHARE_BYTES, "big")
    with pytest.raises(InvalidInputError, match="disagree"):
        combine_key(bad, 2)
    with pytest.raises(InvalidInputError, match="33"):  # an XOR share where a t-of-N share belongs
        combine_key({0: shares[0], 1: b"\0" * 32}, 2)
    with pytest.raises(InvalidInputError, match="below the field's prime"):
        combine_key({0: shares[0], 1: PRIME.to_bytes(SHARE_BYTES, "big")}, 2)
    # the XOR split is unchanged: 80-byte blobs, every share needed
    xor = sealed_key_shares(key, [h.public_hex for h in holders], **PLACE)
    assert [len(b) for b in xor] == [80] * 3 and [len(b) for b in blobs] == [81] * 3
    assert upload_key_from_shares(h.open_share(b, j, **PLACE) for j, (h, b) in enumerate(zip(holders, xor))) == key


def _contract(seals: list[SealKeyPair], t: int, owners: tuple[str, ...] = ("a", "b", "c"),
              ) -> tuple[StudyContract, dict[str, tuple[bytes, bytes]]]:
    keys = {o: generate_signing_key() for o in owners}
    contract = StudyContract.create(study_id="s1", domain_size=64, epsilon=1.0, expected_owners=owners,
                                    context_fingerprint="f" * 64, owner_keys={o: k[1] for o, k in keys.items()},
                                    holder_seal_keys=[s.public_hex for s in seals], seal_threshold=t)
    return contract, keys


def _commit(contract: StudyContract, owner: str, private: bytes, digest: bytes) -> tuple[Commitment, bytes]:
    """An owner's commitment (its c1 digest `digest`) and its upload key."""
    place: dict[str, Any] = dict(study_id="s1", owner_id=owner, idempotency_key="k",
                                 contract_hash=contract.contract_hash)
    key = seal_upload_key(private, digest, **place)
    shares = sealed_key_shares(key, contract.holder_seal_keys, threshold=contract.seal_threshold, **place)
    statement = commitment_statement("s1", owner, "k", contract.contract_hash, digest, shares)
    return Commitment(owner, "k", digest, shares, sign_submission(private, statement)), key


def test_the_contract_names_the_split_and_refuses_one_without_a_majority() -> None:
    seals = [SealKeyPair.load_or_create(None) for _ in range(4)]
    contract, _ = _contract(seals[:3], 2)
    assert contract.seal_threshold == 2 and contract.to_dict()["seal_threshold"] == 2
    assert StudyContract.from_dict(contract.to_dict()) == contract
    assert contract_from_proto(contract_to_proto(contract)).contract_hash == contract.contract_hash
    xor, _ = _contract(seals[:3], 0)
    assert "seal_threshold" not in xor.to_dict() and xor.contract_hash != contract.contract_hash
    # 2 of 4 would let two disjoint pairs close two different sets; 3 of 3 is the XOR split; no seal keys, no split
    for keys, t in ((seals, 2), (seals[:3], 3), (seals[:3], 1)):
        with pytest.raises(InvalidInputError, match="N/2 < t < N"):
            _contract(keys, t)
    with pytest.raises(InvalidInputError, match="needs holder_seal_keys"):
        StudyContract.create(study_id="s1", domain_size=64, epsilon=1.0, expected_owners=("a",),
                             context_fingerprint="f" * 64, seal_threshold=2)


def test_no_two_sets_of_t_holders_close_different_owner_sets() -> None:
    """A CS that closes the uploads on owners {a, b} at one pair of a 2-of-3 study's holders (enough to open a's and b's
    uploads) and then on {a, b, c} (c committing after reading them) at another pair: the holder both pairs share
    refuses the second set, so it never has two holders' shares of c's key, whichever pairs it picks."""
    seals = [SealKeyPair.load_or_create(None) for _ in range(3)]
    contract, keys = _contract(seals, 2)
    (a, key_a), (b, _) = (_commit(contract, o, keys[o][0], bytes([i + 1]) * 32) for i, o in enumerate("ab"))
    c, key_c = _commit(contract, "c", keys["c"][0], b"\x09" * 32)
    for first, second in itertools.permutations(itertools.combinations(range(3), 2), 2):
        books = [CommitmentBook(s, j, 3) for j, s in enumerate(seals)]
        got = {j: books[j].close(contract, [a, b]) for j in first}
        assert upload_key_from_threshold_shares({j: got[j][0] for j in first}, 2) == key_a  # a's upload opens
        shares: dict[int, bytes] = {}
        for j in second:
            if j in first:
                with pytest.raises(FailedPreconditionError, match="closed on"):
                    books[j].close(contract, [a, b, c])
            else:
                shares[j] = books[j].close(contract, [a, b, c])[2]
        assert len(shares) == 1  # one holder outside the first pair: one share of c's key, never two
        with pytest.raises(InvalidInputError, match="at least 2 are needed"):
            upload_key_from_threshold_shares(shares, 2)
        assert all(set(books[j].closed("s1") or ()) == {"a", "b"} for j in first)
    # c's key is c's own (a colluding owner hands it over); what the CS cannot get is t holders computing on c's c1
    assert key_c != key_a


def test_a_holder_refuses_shares_of_another_split_than_its_contracts() -> None:
    seals = [SealKeyPair.load_or_create(None) for _ in range(3)]
    contract, keys = _contract(seals, 2)
    # a commitment sealed by XOR, signed over the t-of-N contract's hash: 32-byte shares where 33 belong
    place: dict[str, Any] = dict(study_id="s1", owner_id="a", idempotency_key="k", contract_hash=contract.contract_hash)
    key = seal_upload_key(keys["a"][0], b"\1" * 32, **place)
    shares = sealed_key_shares(key, contract.holder_seal_keys, **place)
    statement = commitment_statement("s1", "a", "k", contract.contract_hash, b"\1" * 32, shares)
    wrong = Commitment("a", "k", b"\1" * 32, shares, sign_submission(keys["a"][0], statement))
    book = CommitmentBook(seals[0], 0, 3)
    with pytest.raises(InvalidInputError, match="not t-of-N shares"):
        book.close(contract, [wrong])
    assert book.closed("s1") is None
