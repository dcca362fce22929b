"""The join's oblivious pseudonyms (he_partition.join.oprf): RFC 9497's test vectors read on Curve25519's x-line, the
blind evaluation's algebra, and what an owner that holds the join key can compute without the key holder (nothing
that matches)."""

from __future__ import annotations

import hashlib

import pytest
import rbcl

from he_partition.core.errors import InvalidInputError
from he_partition.join import oprf
from he_partition.join.protocol import (JoinKeyPair, JoinTerms, oblivious_pseudonyms, oprf_input, posted_pseudonyms,
                                        pseudonyms)

# RFC 9497, appendix A.1.1 (ristretto255-SHA512, OPRF mode): seed, key info, the derived key, and per vector
# the input, blind, blinded element, evaluation element and output.
SEED = bytes.fromhex("a3" * 32)
KEY_INFO = bytes.fromhex("74657374206b6579")
SK = "5ebcea5ee37023ccb9fc2d2019f9d7737be85591ae8652ffa9ef0f4d37063b0e"
BLIND = bytes.fromhex("64d37aed22a27f5191de1c1d69fadb899d8862b58eb4220029e036ec4c1f6706")
VECTORS = [
    ("00", "609a0ae68c15a3cf6903766461307e5c8bb2f95e7e6550e1ffa2dc99e412803c",
     "7ec6578ae5120958eb2db1745758ff379e77cb64fe77b0b2d8cc917ea0869c7e",
     "527759c3d9366f277d8c6020418d96bb393ba2afb20ff90df23fb7708264e2f3ab9135e3bd69955851de4b1f9fe8a0973396719b7912ba9"
     "ee8aa7d0b5e24bcf6"),
    ("5a" * 17, "da27ef466870f5f15296299850aa088629945a17d1f5b7f5ff043f76b3c06418",
     "b4cbf5a4f1eeda5a63ce7b77c7d23f461db3fcab0dd28e4e17cecb5c90d02c25",
     "f4a74c9c592497375e796aa837e907b1a045d34306a749db9f34221f7e750cb4f2a6413a6bf6fa5e19ba6348eb673934a722a7ede2e7621"
     "306d18951e7cf2c73"),
]


def on_the_line(ristretto: bytes) -> bytes:
    """A ristretto255 element as the u-coordinate of its prime-order point: 1 times its `line_element`."""
    return oprf._multiply(oprf.line_scalar((1).to_bytes(32, "little")), oprf.line_element(ristretto), "an element")


@pytest.mark.parametrize("x, blinded, evaluated, output", VECTORS)
def test_the_oprf_reproduces_rfc_9497s_ristretto255_sha512_test_vectors_on_the_x_line(x: str, blinded: str,
                                                                                      evaluated: str,
                                                                                      output: str) -> None:
    """Each step gives the RFC's element read as a u-coordinate; the RFC's own N gives the RFC's output under the
    same Finalize hash, and the same N on the x-line gives this module's output."""
    key = oprf.derive_key(SEED, KEY_INFO)
    assert key.hex() == SK
    inp = bytes.fromhex(x)
    b = oprf.blind([inp], [BLIND])
    assert b[0] == on_the_line(bytes.fromhex(blinded))
    z = oprf.blind_evaluate(key, b)
    assert z[0] == on_the_line(bytes.fromhex(evaluated))
    n = bytes(rbcl.crypto_scalarmult_ristretto255(key, oprf.hash_to_group(inp)))  # the RFC's N
    assert oprf._output(inp, n).hex() == output
    assert oprf.finalize([inp], [BLIND], z) == [oprf.evaluate(key, inp)] == [oprf._output(inp, on_the_line(n))]


def test_line_scalars_multiply_by_plus_or_minus_the_scalar_and_padding_is_a_uniform_group_element() -> None:
    """X25519 with `line_scalar(t)` is t times the element for every t tried (ristretto255's own multiplication on the
    line); the padding an owner sends is t G for uniform t, as a blinded element is r H(x) for uniform r."""
    import os

    h = oprf.hash_to_group(b"x")
    for t in [1, 2, 7, 9, oprf.GROUP_ORDER - 1, 2 ** 251, 2 ** 252] + [int.from_bytes(os.urandom(32), "little")
                                                                      for _ in range(50)]:
        scalar = (t % oprf.GROUP_ORDER).to_bytes(32, "little")
        c = int.from_bytes(oprf.line_scalar(scalar), "little")
        assert c % 8 == 0 and 2 ** 254 <= c < 2 ** 255 and c % oprf.GROUP_ORDER in (t % oprf.GROUP_ORDER,
                                                                                   -t % oprf.GROUP_ORDER)
        assert oprf._multiply(oprf.line_scalar(scalar), oprf.line_element(h), "h") == on_the_line(
            bytes(rbcl.crypto_scalarmult_ristretto255(scalar, h)))
    # The scalars without one: zero, and the multiples 8j of 8 with 0 < j <= 2^252 - order (about 2^124) and their
    # negatives: a uniform scalar is one of them with probability about 2^-126.
    for t in (0, 8, 8 * (oprf.GROUP_ORDER - 2 ** 252), -8 % oprf.GROUP_ORDER):
        with pytest.raises(InvalidInputError, match="no X25519 form"):
            oprf.line_scalar(t.to_bytes(32, "little"))
    uniform = bytes(range(64))
    t = bytes(rbcl.crypto_core_ristretto255_scalar_reduce(uniform))
    assert oprf.random_element(uniform) == on_the_line(bytes(rbcl.crypto_scalarmult_ristretto255_base(t)))


def test_blind_evaluate_and_unblind_equal_direct_evaluation_and_the_blinded_elements_hide_the_input() -> None:
    key = oprf.study_key(b"m" * 32, "study-1", "c" * 64)
    inputs = [oprf_input(f"person{i}@example.org") for i in range(300)]
    blinds = oprf.blind_scalars(b"s" * 32, len(inputs))
    blinded = oprf.blind(inputs, blinds, threads=2)  # the threaded batch gives the same as one at a time
    assert blinded == [oprf.blind([x], [r])[0] for x, r in zip(inputs, blinds)]
    out = oprf.finalize(inputs, blinds, oprf.blind_evaluate(key, blinded))
    assert out == [oprf.evaluate(key, x) for x in inputs]
    # one input under two blinds: two unrelated elements, the same output
    again = oprf.blind(inputs[:1], oprf.blind_scalars(b"t" * 32, 1))
    assert again[0] != blinded[0]
    assert oprf.finalize(inputs[:1], oprf.blind_scalars(b"t" * 32, 1), oprf.blind_evaluate(key, again)) == out[:1]
    # per-study keys: the same identifier has unrelated values in two studies
    other = oprf.study_key(b"m" * 32, "study-2", "c" * 64)
    assert oprf.evaluate(other, inputs[0]) != out[0]
    assert all(len(b) == 32 and int.from_bytes(b, "little") < oprf.FIELD_PRIME for b in blinded)
    for bad in (b"\xff" * 32, oprf.FIELD_PRIME.to_bytes(32, "little"), b"\x01" * 31):
        with pytest.raises(InvalidInputError, match="not a canonical Curve25519 u-coordinate"):
            oprf.blind_evaluate(key, [bad])
    for u in sorted(oprf.LOW_ORDER_U):  # refused by the check that runs before a page is booked, and by X25519
        with pytest.raises(InvalidInputError, match="low-order point"):
            oprf.check_elements([blinded[0], u.to_bytes(32, "little")])
        with pytest.raises(InvalidInputError, match="low-order point"):
            oprf._multiply(oprf.line_scalar(key), u.to_bytes(32, "little"), "this element")


def test_an_owner_holding_the_join_key_computes_no_pseudonym_of_the_other_owners_customers() -> None:
    """The dictionary attack of an owner colluding with the computation server, offline: it holds the join key, its
    own records and PRF values, and the other owner's posted list; every pseudonym it can compute from a guessed
    identifier without the key holder (the HMAC of the identifier, the HMAC of an evaluation under any key it
    could make up, or under the values it was answered for its own records) matches nothing of the other
    owner's customers that it does not hold itself."""
    terms = JoinTerms.from_params({"shape": [2, 2], "capacity": 8192, "padding_epsilon": 1.0, "padding_offset": 44,
                                   "pseudonyms": "oprf", "max_records": [1000, 1000]}, domain_size=4)
    study_key = oprf.study_key(hashlib.sha256(b"key holder").digest(), "s", "h" * 64)
    pa, pb = JoinKeyPair(), JoinKeyPair()
    join_key = pa.join_key(pb.public_bytes, study_id="s", contract_hash="h")
    ids = [f"+44 7700 9{i:05d}" for i in range(2000)]  # phone numbers: enumerable
    a_ids, b_ids = ids[:1000], ids[500:1500]
    prf = {i: oprf.evaluate(study_key, oprf_input(i)) for i in ids[:1500]}  # what the key holder's answers give
    b_list, _ = posted_pseudonyms(pb, join_key, b_ids, terms, study_id="s", prf_outputs=[prf[i] for i in b_ids])
    b_set = set(b_list)
    # What HMAC pseudonyms gave such a coalition: every one of B's identifiers in the dictionary.
    assert sum(p in b_set for p in pseudonyms(join_key, ids)) == 0
    assert len(set(pseudonyms(join_key, b_ids)) & set(posted_pseudonyms(
        pb, join_key, b_ids, JoinTerms.from_params({"shape": [2, 2], "capacity": 8192, "padding_epsilon": 1.0,
                                                      "padding_offset": 44}, domain_size=4), study_id="s")[0])) == 1000
    # Without the study's key: guessed keys, and keys the owner could make from what it holds, recover nothing.
    guessed_keys = [oprf.derive_key(join_key, b"guess"), oprf.derive_key(pa.private_secret("s"), b"guess")]
    for k in guessed_keys:
        outs = [oprf.evaluate(k, oprf_input(i)) for i in ids]
        assert not set(oblivious_pseudonyms(join_key, outs)) & b_set
    # With its own answers: exactly its own records that B also holds (what the join tells it anyway).
    own = set(oblivious_pseudonyms(join_key, [prf[i] for i in a_ids])) & b_set
    assert len(own) == 500
    # A legacy-mode list cannot be posted for an oblivious study without the key holder's values.
    with pytest.raises(InvalidInputError, match="OPRF value from the key holder"):
        posted_pseudonyms(pa, join_key, a_ids, terms, study_id="s")


def test_the_evaluation_quota_follows_the_declared_records_and_dummies() -> None:
    base = {"shape": [2, 2], "capacity": 8192, "padding_epsilon": 1.0, "padding_offset": 44}
    terms = JoinTerms.from_params({**base, "pseudonyms": "oprf", "max_records": [1000, 3000]}, domain_size=4)
    assert terms.oblivious and terms.evaluation_quota(0) == 1000 + 88 and terms.evaluation_quota(1) == 3000 + 88
    assert JoinTerms.from_params({**base, "pseudonyms": "oprf"}, domain_size=4).evaluation_quota(0) == 8192
    assert not JoinTerms.from_params(base, domain_size=4).oblivious  # contracts from before: HMAC pseudonyms
    with pytest.raises(InvalidInputError, match="pseudonyms 'sha1' are none of oprf, hmac"):
        JoinTerms.from_params({**base, "pseudonyms": "sha1"}, domain_size=4)
    with pytest.raises(InvalidInputError, match="max_records must be two integers"):
        JoinTerms.from_params({**base, "max_records": [10]}, domain_size=4)
    with pytest.raises(InvalidInputError, match="exceed the join capacity"):
        JoinTerms.from_params({**base, "max_records": [8000, 8000]}, domain_size=4)


def test_the_batch_inversion_of_the_blinds_equals_one_inversion_each() -> None:
    """Finalize unblinds with Montgomery's trick (one inversion per batch): the same inverses, the same PRF values."""
    import rbcl

    from he_partition.join.oprf import _inverses

    blinds = oprf.blind_scalars(b"\x07" * 32, 300)
    assert _inverses(blinds) == [bytes(rbcl.crypto_core_ristretto255_scalar_invert(r)) for r in blinds]
    assert _inverses(blinds[:1]) == [bytes(rbcl.crypto_core_ristretto255_scalar_invert(blinds[0]))]
    assert _inverses([]) == []
    with pytest.raises(InvalidInputError, match="zero"):
        _inverses([blinds[0], bytes(32)])
    key = oprf.study_key(b"k" * 32, "s", "h")
    inputs = [f"id|{i}".encode() for i in range(300)]
    evaluated = oprf.blind_evaluate(key, oprf.blind(inputs, blinds))
    assert oprf.finalize(inputs, blinds, evaluated) == [oprf.evaluate(key, x) for x in inputs]


def test_the_worker_processes_give_exactly_the_in_process_values_and_a_dead_worker_fails_the_batch() -> None:
    """A batch in spawned worker processes (forced here by a small threshold and small tasks: parts of 7 elements)
    equals the in-process batch byte for byte; a worker's refusal is raised as the worker raised it; a worker that
    dies fails its batch with WorkerLostError instead of hanging, and the next batch starts new workers."""
    import os
    import signal

    from he_partition.core.errors import WorkerLostError

    key = oprf.study_key(b"w" * 32, "s", "h")
    inputs = [oprf_input(f"+44 7700 {i:07d}") for i in range(50)]
    blinds = oprf.blind_scalars(b"b" * 32, len(inputs))
    here = oprf.OprfPool(0)
    pool = oprf.OprfPool(2, min_elements=10, task=7)
    assert pool.uses_processes(10) and not pool.uses_processes(9) and not here.uses_processes(10**6)
    try:
        blinded = oprf.blind(inputs, blinds, pool=pool)
        assert blinded == oprf.blind(inputs, blinds, pool=here)
        evaluated = oprf.blind_evaluate(key, blinded, pool=pool)
        assert evaluated == oprf.blind_evaluate(key, blinded, pool=here)
        out = oprf.finalize(inputs, blinds, evaluated, pool=pool)
        assert out == oprf.finalize(inputs, blinds, evaluated, pool=here) == [oprf.evaluate(key, x) for x in inputs]
        oprf.check_elements(blinded)
        with pytest.raises(InvalidInputError, match="not a canonical"):
            oprf.check_elements(blinded[:20] + [b"\xff" * 32])
        with pytest.raises(InvalidInputError, match="not a canonical"):
            oprf.blind_evaluate(key, blinded[:20] + [b"\xff" * 32], pool=pool)
        executor = pool._executor
        assert executor is not None
        worker = next(iter(executor._processes.values()))
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        with pytest.raises(WorkerLostError, match="OPRF worker process ended abruptly"):
            oprf.blind_evaluate(key, blinded, pool=pool)
        assert oprf.blind_evaluate(key, blinded, pool=pool) == evaluated  # new workers
    finally:
        pool.close()


def test_a_multiprocessing_child_that_used_the_default_pool_exits() -> None:
    """A process started by multiprocessing (an owner's process in the benchmarks) joins its children on its way out
    and runs no atexit handler: the default pool must end its workers first, or the child never exits."""
    import multiprocessing

    inputs = [oprf_input(f"id{i}") for i in range(oprf.MIN_POOLED_ELEMENTS)]
    child = multiprocessing.get_context("spawn").Process(
        target=oprf.blind, args=(inputs, oprf.blind_scalars(b"c" * 32, len(inputs))))
    child.start()
    child.join(120)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0


def test_blind_scalars_from_the_workers_equal_those_derived_here() -> None:
    pool = oprf.OprfPool(2, min_elements=8, task=7)
    try:
        assert oprf.blind_scalars(b"\x09" * 32, 40, pool=pool) == oprf.blind_scalars(b"\x09" * 32, 40,
                                                                                      pool=oprf.OprfPool(0))
    finally:
        pool.close()
