"""c1 of measurement chunks: the computation side's noise goes to c0 only in threshold mode.

Real TenSEAL ciphertexts under a collective key; the chunk worker is the one every executor runs
(in-process, local processes, Ray), fed the marked context bytes as the executors pass them on.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.execution.base import ChunkBytes, ChunkWorker, noise_in_c0_context
from he_partition.he.bfv import BfvBackend, load_context
from he_partition.he.threshold.c1 import C1_MISMATCH, aggregate_c1, c1_of_vector, check_c1
from he_partition.he.threshold.context import collective_context_bytes, vector_ciphertext

from .test_threshold import make_setup


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    s = make_setup()
    data = collective_context_bytes(s["pk"])
    be = BfvBackend(load_context(data))
    rng = np.random.default_rng(3)
    owners = [[be.serialize_chunk(c) for c in be.encrypt(rng.integers(0, 9, 2 * be.slots)).chunks] for _ in range(3)]
    return {**s, "data": data, "be": be, "owners": owners}


def _measured(s: dict[str, Any], context: bytes) -> list[bytes]:
    worker = ChunkWorker()
    worker.load("r", context, ChunkBytes(tuple(tuple(o) for o in s["owners"])), [0, 1])
    noise = np.random.default_rng(4).integers(-30, 30, s["be"].slots)
    return [worker.noised("r", i, noise) for i in (0, 1)]


def test_a_worker_given_the_marked_context_keeps_the_owners_aggregate_c1(setup: dict[str, Any]) -> None:
    be = setup["be"]
    moduli = [int(m.value()) for m in be.context.seal_context().data.first_context_data().parms().coeff_modulus()]
    for i, chunk in enumerate(_measured(setup, noise_in_c0_context(setup["data"]))):
        expected = aggregate_c1([c1_of_vector(be.context, o[i]) for o in setup["owners"]], moduli)
        check_c1(be.context, vector_ciphertext(chunk), expected, chunk=i)


def test_the_single_key_holders_form_re_randomizes_c1_and_is_refused(setup: dict[str, Any]) -> None:
    be = setup["be"]
    moduli = [int(m.value()) for m in be.context.seal_context().data.first_context_data().parms().coeff_modulus()]
    chunk = _measured(setup, setup["data"])[0]  # unmarked: the noise under a fresh encryption (K = 1, unchanged)
    expected = aggregate_c1([c1_of_vector(be.context, o[0]) for o in setup["owners"]], moduli)
    with pytest.raises(InvalidInputError, match=C1_MISMATCH):
        check_c1(be.context, vector_ciphertext(chunk), expected, chunk=0)
