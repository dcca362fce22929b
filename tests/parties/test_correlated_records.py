"""Studies with correlated records (seed 003, Bayesian DP): contract terms, (1 + L) charge and noise, SDK, CLI."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import grpc
import numpy as np
import pytest

import parties.common.contract as contract_module
from he_partition.methods.bayesian import adjacency_digest, max_leakage
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.core.measurements import PartitionSums
from he_partition.core.noise import discrete_laplace_variance, laplace_scale
from parties.cli import main as dpagg_main
from parties.common.contract import CONTRACT_VERSION_V1, StudyContract
from parties.common.convert import contract_from_proto, contract_to_proto
from parties.common.errors import ServiceError

from .conftest import Cluster, blocky_histograms

FP = "0123456789abcdef" * 4
PINNED = (  # tests/parties/test_contract_and_keys.py pins the same text: contracts without the option hash as before
    '{"context_fingerprint":"' + FP + '","contribution_bound":1,"domain_size":100,"domain_spec":"age:0:100:100",'
    '"epsilon":0.5,"expected_owners":["a","b"],"noise_parties":2,"strategy":"gap","strategy_params":{},'
    '"study_id":"s1","version":"dpagg.contract.v1"}'
)


def _contract(**kw: object) -> StudyContract:
    args: dict[str, object] = {"study_id": "s1", "domain_size": 100, "epsilon": 0.5, "expected_owners": ("b", "a"),
                               "context_fingerprint": FP, "domain_spec": "age:0:100:100", "strategy": "gap",
                               "version": CONTRACT_VERSION_V1, **kw}
    return StudyContract(**args)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- contract
def test_zero_leakage_leaves_the_canonical_form_and_hash_unchanged() -> None:
    for c in (_contract(), _contract(correlation_leakage=0.0), _contract(correlation_leakage=0, correlation_source="")):
        assert c.canonical_json() == PINNED
        assert c.contract_hash == hashlib.sha256(PINNED.encode()).hexdigest()
        assert c.noise_multiplier == 1.0 and not c.correlated and c.dp_epsilon(0.5) == 0.5


def test_leakage_and_source_are_part_of_the_hash() -> None:
    c = _contract(correlation_leakage=1.5, correlation_source="w_sha256=ab tau=0.5 n=3")
    text = c.canonical_json()
    assert '"correlation_leakage":1.5,"correlation_source":"w_sha256=ab tau=0.5 n=3"' in text
    assert c.contract_hash == hashlib.sha256(text.encode()).hexdigest()
    assert c.contract_hash != _contract().contract_hash
    assert c.contract_hash != _contract(correlation_leakage=1.5).contract_hash           # the source counts
    assert c.contract_hash != _contract(correlation_leakage=1.25,
                                        correlation_source="w_sha256=ab tau=0.5 n=3").contract_hash
    assert _contract(correlation_source="independent: W = 0").contract_hash != _contract().contract_hash
    assert StudyContract.from_json(text) == c
    assert c.noise_multiplier == 2.5 and c.correlated and c.dp_epsilon(0.5) == 0.2
    p = contract_to_proto(c)
    assert (p.correlation_leakage, p.correlation_source) == (1.5, "w_sha256=ab tau=0.5 n=3")
    assert contract_from_proto(p) == c
    p.correlation_leakage = 0.5  # a smaller L in transit would under-noise: refused
    with pytest.raises(InvalidInputError, match="contract hash mismatch"):
        contract_from_proto(p)


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), -float("inf")])
def test_bad_leakage_is_refused_naming_the_field(value: float) -> None:
    with pytest.raises(InvalidInputError, match=r"correlation_leakage must be >= 0 and finite"):
        _contract(correlation_leakage=value)
    with pytest.raises(InvalidInputError, match="correlation_leakage"):
        StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["a"],
                             context_fingerprint=FP, correlation_leakage=value)


@pytest.mark.parametrize("value", [True, "1.0", None])
def test_leakage_must_be_a_number(value: object) -> None:
    with pytest.raises(InvalidInputError, match="correlation_leakage must be a number"):
        _contract(correlation_leakage=value)


@pytest.mark.parametrize("value", ["x" * 513, "line\nbreak", "tab\there", 3])
def test_bad_source_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidInputError, match="correlation_source must be printable text of at most 512"):
        _contract(correlation_leakage=1.0, correlation_source=value)


def test_from_dict_refuses_bad_terms() -> None:
    d = {**json.loads(PINNED), "correlation_leakage": -1}
    with pytest.raises(InvalidInputError, match="correlation_leakage"):
        StudyContract.from_dict(d)


def test_the_strategy_is_validated_at_the_dp_epsilon(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = contract_module.make_strategy

    def spy(name: str, domain_size: int, epsilon: float, **kw: object):  # type: ignore[no-untyped-def]
        seen.append(epsilon)
        return real(name, domain_size, epsilon, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(contract_module, "make_strategy", spy)
    _contract(epsilon=3.0, correlation_leakage=2.0)
    _contract(epsilon=3.0)
    assert seen == [1.0, 3.0]


# ---------------------------------------------------------------------------------------- services
def test_release_with_correlated_records_spends_the_bdp_budget_with_scaled_noise(cluster: Cluster) -> None:
    n = 64
    source = "test: two correlated records, tau = 0"
    contract = cluster.open_study(domain_size=n, epsilon=1.0, strategy="gap", correlation_leakage=1.0,
                                  correlation_source=source)
    assert (contract.correlation_leakage, contract.correlation_source, contract.noise_multiplier) == (1.0, source, 2.0)
    # Both servers hold the same terms (StudyStatus from the CS, GetStudy from the DS).
    cs = cluster.computation()
    assert cs.study_status("s1").contract == contract
    assert cluster.decryption().get_study("s1") == contract
    assert cluster.ds.handler.ledger.get_study("s1") == contract  # read back from SQLite

    for owner, h in zip(("a", "b", "c"), blocky_histograms(n)):
        assert cluster.owner(owner).submit("s1", h).committed
    rel = cs.run_release("s1")
    assert rel.state == "DONE" and rel.epsilon == 1.0
    s = rel.summary
    assert s is not None
    # The strategy ran at DP epsilon 1.0 / (1 + 1) = 0.5: gap split 0.2 / 0.8 of it.
    assert s.epsilon == 0.5
    assert s.epsilon_spent == (("prefix_differences", 0.1), ("partition_sums", 0.4))
    per_sum = 2 * discrete_laplace_variance(laplace_scale(1, 0.4))   # noise_parties = 2, c = 1
    assert s.sum_variance == (per_sum,) * s.n_partitions
    assert per_sum == 2 * discrete_laplace_variance(laplace_scale(2, 0.8))  # = twice the plain-DP scale at eps 0.8
    assert s.params["bayesian_dp"] == {
        "epsilon": 1.0, "dp_epsilon": 0.5, "max_leakage": 1.0, "noise_multiplier": 2.0, "source": source,
        "model": "gaussian_correlation (seed 003); neighbours: one person added or removed while correlated "
                 "records follow the model"}
    assert cluster.analyst().get_release(rel.release_id).summary == s

    # The ledger charged (1 + L) times each DP epsilon: exactly the study's Bayesian-DP budget.
    budget = cluster.decryption().budget("s1")
    assert [(c.kind, c.epsilon) for c in budget.charges] == [("prefix_differences", 0.2), ("partition_sums", 0.8)]
    assert budget.spent == 1.0 and budget.total == 1.0 and budget.remaining == 0.0

    with pytest.raises(ServiceError) as ei:
        cs.run_release("s1")
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cluster.decryption().budget("s1").spent == 1.0


def test_the_decryption_server_charges_the_multiplier_itself(cluster: Cluster) -> None:
    """Whatever the computation server sends, a measurement costs (1 + L) times its DP epsilon at the key holder."""
    contract = cluster.open_study(domain_size=64, epsilon=1.0, strategy="hier", correlation_leakage=1.0)
    handler = cluster.ds.handler
    common = dict(contract_hash=contract.contract_hash, release_id="rel-x", release_epsilon=1.0)
    handler.check_measurement(contract, PartitionSums(64, 0.5, 1, starts=(0, 32)), 1, **common)  # charge 1.0 fits
    with pytest.raises((InvalidInputError, BudgetExhaustedError), match="1.2"):
        handler.check_measurement(contract, PartitionSums(64, 0.6, 1, starts=(0, 32)), 1, **common)  # 1.2 > 1.0
    assert handler.ledger.charges("s1") == []


def test_a_one_measurement_release_is_not_refused_for_a_rounding_ulp(cluster: Cluster) -> None:
    """privelet spends everything on one measurement: (0.7 / 1.2) * 1.2 is 0.7000000000000001 in floats."""
    assert (0.7 / 1.2) * 1.2 > 0.7
    cluster.open_study(domain_size=64, epsilon=0.7, strategy="privelet", correlation_leakage=0.2, owners=("a",))
    cluster.owner("a").submit("s1", np.arange(64))
    rel = cluster.computation().run_release("s1")
    assert rel.state == "DONE" and rel.summary is not None
    assert rel.summary.params["bayesian_dp"]["dp_epsilon"] == 0.7 / 1.2
    budget = cluster.decryption().budget("s1")
    assert [(c.kind, c.epsilon) for c in budget.charges] == [("haar_coefficients", 0.7)] and budget.spent == 0.7


def test_a_plain_study_is_unchanged(cluster: Cluster) -> None:
    contract = cluster.open_study(domain_size=64, epsilon=1.0)
    assert contract.correlation_leakage == 0.0 and "correlation" not in contract.canonical_json()
    for owner, h in zip(("a", "b", "c"), blocky_histograms(64)):
        cluster.owner(owner).submit("s1", h)
    s = cluster.computation().run_release("s1").summary
    assert s is not None and "bayesian_dp" not in s.params
    assert s.epsilon_spent == (("prefix_differences", 0.2), ("partition_sums", 0.8))


def test_open_study_refuses_bad_leakage_over_the_wire(cluster: Cluster) -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ServiceError) as ei:
            cluster.open_study(domain_size=8, correlation_leakage=bad)
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "correlation_leakage" in ei.value.details
    assert cluster.ds.handler.ledger.list_studies() == []


# ---------------------------------------------------------------------------------------- CLI
def _cli(cluster: Cluster, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = dpagg_main(["open-study", "--computation", cluster.cs.target, "--insecure", "--domain-size", "16",
                       "--epsilon", "1.0", "--owners", "a,b", "--strategy", "hier", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_open_study_with_a_correlation_graph(cluster: Cluster, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    w = np.array([[0, 1, 0.5], [1, 0, 2], [0.5, 2, 0]])
    csv = tmp_path / "graph.csv"
    csv.write_text("\n".join(",".join(f"{v:g}" for v in row) for row in w) + "\n")
    npy = tmp_path / "graph.npy"
    np.save(npy, w)

    code, out, err = _cli(cluster, capsys, "--study-id", "g1", "--correlation-graph", str(csv),
                          "--correlation-tau", "0.25", "--json")
    assert code == 0, err
    got = json.loads(out)
    leak = max_leakage(w, 0.25)
    assert got["correlation_leakage"] == leak and got["noise_multiplier"] == 1.0 + leak
    assert got["correlation_source"] == f"file=graph.csv w_sha256={adjacency_digest(w)} tau=0.25 n=3"
    contract = cluster.computation().study_status("g1").contract
    assert contract.correlation_leakage == leak and got["contract_hash"] == contract.contract_hash

    # The same matrix as .npy gives the same L and digest; tau defaults to 0 (connected graph: L = n - 1).
    code, out, err = _cli(cluster, capsys, "--study-id", "g2", "--correlation-graph", str(npy))
    assert code == 0, err
    leak0 = max_leakage(w, 0.0)
    assert math.isclose(leak0, 2.0, rel_tol=1e-12)
    assert f"max leakage L = {leak0:g}, noise multiplier {1 + leak0:g}" in out
    assert cluster.computation().study_status("g2").contract.correlation_leakage == leak0

    code, out, err = _cli(cluster, capsys, "--study-id", "g3", "--correlation-leakage", "0.5",
                          "--correlation-source", "dpagg bayes-scale on census graph", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert (got["correlation_leakage"], got["noise_multiplier"]) == (0.5, 1.5)


def test_cli_open_study_refuses_bad_correlation_options(cluster: Cluster, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    asym = tmp_path / "asym.csv"
    asym.write_text("0,1\n2,0\n")
    code, _, err = _cli(cluster, capsys, "--correlation-graph", str(asym))
    assert code == 1 and "symmetric" in err
    disconnected = tmp_path / "iso.csv"
    disconnected.write_text("0,0\n0,0\n")
    code, _, err = _cli(cluster, capsys, "--correlation-graph", str(disconnected))
    assert code == 1 and "connected" in err and "tau" in err
    code, _, err = _cli(cluster, capsys, "--correlation-tau", "1")
    assert code == 1 and "--correlation-tau needs --correlation-graph" in err
    code, _, err = _cli(cluster, capsys, "--correlation-graph", str(tmp_path / "missing.csv"))
    assert code == 1 and "no such file" in err
    code, _, err = _cli(cluster, capsys, "--correlation-leakage", "-1")
    assert code == 1 and "INVALID_ARGUMENT" in err and "correlation_leakage" in err
    with pytest.raises(SystemExit) as ei:  # argparse: the two ways of giving L exclude each other
        _cli(cluster, capsys, "--correlation-graph", str(asym), "--correlation-leakage", "1")
    assert ei.value.code == 2
    assert cluster.ds.handler.ledger.list_studies() == []


def test_open_study_reports_the_epsilon_guidance_of_seed_002(cluster: Cluster,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Opening a study reports 1/(e^eps-1)^2 and alpha = 4/(e^eps-1)^2 and warns outside the practical range."""
    code, out, err = _cli(cluster, capsys, "--study-id", "guide", "--json")
    g = json.loads(out)["epsilon_guidance"]
    assert code == 0 and err == ""
    assert g["variance_lower_bound"] == 1 / math.expm1(1.0) ** 2 and g["guessing_bound_alpha"] == 4 / math.expm1(1.0) ** 2
    assert g["warnings"] == []
    code = dpagg_main(["open-study", "--computation", cluster.cs.target, "--insecure", "--domain-size", "16",
                       "--epsilon", "0.05", "--owners", "a", "--strategy", "hier", "--study-id", "tiny"])
    out, err = capsys.readouterr()
    assert code == 0 and "warning: epsilon 0.05 is below 0.1" in err
    # the variance floor is worth a line; alpha = 1522 >= 1 says nothing, so it is not printed
    assert "variance >= 380.4" in out and "alpha" not in out and "vacuous" not in out
    dpagg_main(["open-study", "--computation", cluster.cs.target, "--insecure", "--domain-size", "16",
                "--epsilon", "1", "--owners", "a", "--study-id", "usual"])
    assert "variance >=" not in capsys.readouterr().out  # the usual epsilon: no guidance line at all
    dpagg_main(["open-study", "--computation", cluster.cs.target, "--insecure", "--domain-size", "16",
                "--epsilon", "3", "--owners", "a", "--study-id", "weak"])
    assert "wrong with probability at most alpha = 0.01098" in capsys.readouterr().out
