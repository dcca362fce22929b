"""Direct noisy range counts through the real services: answers, max-overlap charges, refusals, replays."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import grpc
import numpy as np

from he_partition.core.noise import SeededRandom
from he_partition.protocol import ComputationSide
import pytest

from he_partition.core.backend import ChunkedVector
from he_partition.he.bfv import BfvBackend, load_context
from he_partition.core.measurements import RangeCount, owner_encoding
from he_partition.core.noise import discrete_laplace_variance, laplace_scale
from parties.cli import main as cli_main
from parties.common.errors import ServiceError

from .conftest import Cluster, status_of

MASK = Fraction(1, 2**20)


def _submitted(cluster: Cluster, n: int = 5000, epsilon: float = 1.0) -> np.ndarray:
    cluster.open_study(domain_size=n, owners=("a", "b"), epsilon=epsilon)
    rng = np.random.default_rng(9)
    hs = [rng.integers(0, 40, n) for _ in range(2)]
    for owner, h in zip("ab", hs):
        cluster.owner(owner).submit("s1", h)
    return hs[0] + hs[1]


def test_answers_are_noisy_counts_charged_by_the_heaviest_overlap(cluster: Cluster) -> None:
    total = _submitted(cluster)
    cs = cluster.computation()
    ranges = [(0, 10), (0, 15), (20, 30), (4090, 4100)]  # the last one spans two ciphertext chunks
    r = cs.direct_range_counts("s1", ranges, 0.1)
    se = math.sqrt(2 * discrete_laplace_variance(laplace_scale(1, 0.1)))
    assert [(c.lo, c.hi) for c in r.counts] == ranges
    for c in r.counts:
        assert c.standard_error == pytest.approx(se)
        assert c.value == int(c.value) and abs(c.value - total[c.lo:c.hi].sum()) < 6 * se
    # bins 5-9: (0,10), (0,15) and the masks in front of (20,30) and (4090,4100) -> 2 eps + 2 masks
    expected = float(2 * Fraction("0.1") + 2 * MASK)
    assert r.epsilon_charged == expected and r.epsilon_sequential == pytest.approx(0.4)
    budget = cluster.decryption().budget("s1")
    assert [(c.kind, c.epsilon, c.release_id) for c in budget.charges] == [("range_count", expected, r.request_id)]
    assert r.epsilon_remaining == pytest.approx(1.0 - expected)
    assert r.owners == ("a", "b")
    # a second batch over the same bins adds only its own overlap
    r2 = cs.direct_range_counts("s1", [(2, 8)], 0.1)
    assert r2.epsilon_charged == pytest.approx(0.1)
    assert cluster.ds.handler.ledger.check_consistency() == []


def test_a_keyed_retry_returns_the_same_answers_and_charges_nothing(cluster: Cluster) -> None:
    _submitted(cluster, n=64)
    cs = cluster.computation()
    first = cs.direct_range_counts("s1", [(0, 64), (10, 20)], 0.2, request_key="k-1")
    again = cs.direct_range_counts("s1", [(0, 64), (10, 20)], 0.2, request_key="k-1")
    assert again.counts == first.counts and again.request_id == first.request_id and again.epsilon_charged == 0.0
    assert len(cluster.decryption().budget("s1").charges) == 1
    with pytest.raises(ServiceError) as ei:
        cs.direct_range_counts("s1", [(0, 32)], 0.2, request_key="k-1")
    assert status_of(ei) == grpc.StatusCode.ALREADY_EXISTS and "k-1" in ei.value.details


def test_a_batch_past_the_budget_is_refused_before_anything_is_charged(cluster: Cluster) -> None:
    _submitted(cluster, n=64, epsilon=0.5)
    cs = cluster.computation()
    cs.run_release("s1", epsilon=0.3)
    before = cluster.snapshot()
    with pytest.raises(ServiceError) as ei:
        cs.direct_range_counts("s1", [(0, 8), (4, 12)], 0.15)  # overlap 0.3 > 0.2 left
    assert status_of(ei) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "nothing was charged or decrypted" in ei.value.details
    assert cluster.snapshot() == before and cluster.ds.handler.ledger.direct_pieces("s1") == []
    # the same two ranges side by side fit: they overlap nowhere
    ok = cs.direct_range_counts("s1", [(0, 8), (8, 16)], 0.15)
    assert ok.epsilon_charged == float(Fraction("0.15") + MASK)


@pytest.mark.parametrize("ranges, epsilon, code, words", [
    ([], 0.1, grpc.StatusCode.INVALID_ARGUMENT, "ranges is empty"),
    ([(0, 65)], 0.1, grpc.StatusCode.INVALID_ARGUMENT, "range 0 [0, 65) is invalid"),
    ([(3, 3)], 0.1, grpc.StatusCode.INVALID_ARGUMENT, "need 0 <= lo < hi <= 64"),
    ([(0, 8)], 0.0, grpc.StatusCode.INVALID_ARGUMENT, "epsilon must be > 0"),
    ([(0, 8)], math.inf, grpc.StatusCode.INVALID_ARGUMENT, "epsilon must be > 0"),
])
def test_bad_requests_name_the_problem_and_change_nothing(cluster: Cluster, ranges: list[tuple[int, int]],
                                                          epsilon: float, code: grpc.StatusCode,
                                                          words: str) -> None:
    _submitted(cluster, n=64)
    before = cluster.snapshot()
    with pytest.raises(ServiceError) as ei:
        cluster.computation().direct_range_counts("s1", ranges, epsilon)
    assert status_of(ei) == code and words in ei.value.details
    assert cluster.snapshot() == before


def test_states_that_cannot_answer_are_refused(cluster: Cluster) -> None:
    cs = cluster.computation()
    with pytest.raises(ServiceError) as ei:
        cs.direct_range_counts("nope", [(0, 1)], 0.1)
    assert status_of(ei) == grpc.StatusCode.NOT_FOUND
    cluster.open_study(domain_size=64, owners=("a", "b"))
    with pytest.raises(ServiceError) as ei:
        cs.direct_range_counts("s1", [(0, 1)], 0.1)
    assert status_of(ei) == grpc.StatusCode.FAILED_PRECONDITION and "no data owner has submitted" in ei.value.details
    cluster.owner("a").submit("s1", np.ones(64, dtype=int))
    with pytest.raises(ServiceError) as ei:
        cs.direct_range_counts("s1", [(0, 1)], 0.1)
    assert status_of(ei) == grpc.StatusCode.FAILED_PRECONDITION and "b" in ei.value.details
    assert cs.direct_range_counts("s1", [(0, 64)], 0.1, force=True).owners == ("a",)


def test_the_decryption_server_decrypts_only_paid_ranges_and_each_once(cluster: Cluster) -> None:
    contract = cluster.open_study(domain_size=64, owners=("a",))
    ds = cluster.decryption()
    be = BfvBackend(load_context(ds.public_context(study_id=contract.study_id)))
    vec: ChunkedVector = be.encrypt(owner_encoding(np.arange(64)))
    m = RangeCount(64, 0.1, 1, lo=0, hi=10)
    chunks = [be.serialize_chunk(c) for c in ComputationSide(be, SeededRandom(5)).measure(vec, m).chunks]

    def decrypt(request_id: str) -> np.ndarray:
        return ds.decrypt_measurement(study_id="s1", release_id=request_id, release_epsilon=0.1, measurement=m,
                                      chunks=chunks, chunk_count=1, contract_hash=contract.contract_hash).values

    with pytest.raises(ServiceError) as ei:
        decrypt("dq-unpaid")
    assert status_of(ei) == grpc.StatusCode.FAILED_PRECONDITION and "no paid" in ei.value.details
    paid = ds.charge_direct_queries(study_id="s1", request_id="dq-1", contract_hash=contract.contract_hash,
                                    ranges=[(0, 10)], epsilon=0.1)
    assert paid.epsilon_charged == 0.1 and not paid.already_charged
    assert abs(int(decrypt("dq-1")[0]) - 45) < 100  # sum(0..9) + the server's own noise
    with pytest.raises(ServiceError) as ei:
        decrypt("dq-1")  # a replay of the same paid range
    assert status_of(ei) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ServiceError) as ei:
        ds.charge_direct_queries(study_id="s1", request_id="dq-2", contract_hash="0" * 64, ranges=[(0, 1)],
                                 epsilon=0.1)
    assert status_of(ei) == grpc.StatusCode.FAILED_PRECONDITION and "contract_hash" in ei.value.details


def test_role_checks_for_direct_queries(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    _submitted(cluster, n=64)
    answers = cluster.computation("analyst-1", "analyst").direct_range_counts("s1", [(0, 10)], 0.1)
    assert len(answers.counts) == 1
    with pytest.raises(ServiceError) as ei:
        cluster.computation("a", "data_owner").direct_range_counts("s1", [(0, 10)], 0.1)
    assert status_of(ei) == grpc.StatusCode.PERMISSION_DENIED


def test_cli_direct_query(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    total = _submitted(cluster, n=64)
    assert cli_main(["direct-query", "s1", "--range", "0:10", "--range", "5:20", "--epsilon", "0.25",
                     "--computation", cluster.cs.target, "--insecure", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(c["lo"], c["hi"]) for c in out["range_counts"]] == [(0, 10), (5, 20)]
    assert out["epsilon_charged"] == 0.5  # bins 5-9 hold both; the mask [0, 5) meets only the first
    assert out["epsilon_sequential"] == 0.5
    assert abs(out["range_counts"][0]["value"] - total[:10].sum()) < 100
    assert cli_main(["direct-query", "s1", "--range", "30:40", "--epsilon", "0.1",
                     "--computation", cluster.cs.target, "--insecure"]) == 0
    text = capsys.readouterr().out
    assert "[30, 40):" in text and "max-overlap rule" in text


def test_correlated_studies_charge_direct_ranges_in_full_times_the_multiplier(cluster: Cluster) -> None:
    """With leakage L the ranges are noised at eps / (1 + L) and cost (1 + L) times every piece (no parallel
    composition: correlated records leak across disjoint ranges)."""
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0, correlation_leakage=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    r = cluster.computation().direct_range_counts("s1", [(0, 10), (20, 30)], 0.2)
    assert r.epsilon_charged == float(2 * (2 * Fraction("0.1") + MASK))
    se = math.sqrt(2 * discrete_laplace_variance(laplace_scale(1, 0.1)))
    assert [c.standard_error for c in r.counts] == [pytest.approx(se)] * 2
    assert cluster.ds.handler.ledger.check_consistency() == []
