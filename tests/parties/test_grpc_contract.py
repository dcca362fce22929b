"""The gRPC contract as clients in any language meet it: health, status codes, contract validation."""

from __future__ import annotations

import grpc
import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.contract import StudyContract

from .conftest import Cluster


def test_health_list_answers_every_service(cluster: Cluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(cluster.cs.target) as channel:
        resp = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=5)
    assert resp.statuses["dpagg.v1.Computation"].status == health_pb2.HealthCheckResponse.SERVING
    assert resp.statuses[""].status == health_pb2.HealthCheckResponse.SERVING


def test_not_implemented_maps_to_unimplemented() -> None:
    from parties.common.errors import status_for

    assert status_for(NotImplementedError("x"))[0] == grpc.StatusCode.UNIMPLEMENTED



def test_domain_spec_must_match_domain_size_and_epsilon_is_bounded(cluster: Cluster) -> None:
    with pytest.raises(InvalidInputError, match="has 20 bins but domain_size is 50"):
        StudyContract.create(study_id="s1", domain_size=50, epsilon=1.0, expected_owners=("a",),
                             context_fingerprint="0" * 64, domain_spec="age:0:100:20")
    assert StudyContract.create(study_id="s1", domain_size=20, epsilon=1.0, expected_owners=("a",),
                                context_fingerprint="0" * 64, domain_spec="age:0:100:20").domain_size == 20
    from parties.common.errors import ServiceError

    for eps in (1e308, 1e4):
        with pytest.raises(ServiceError) as ei:
            cluster.computation().open_study(study_id="big", domain_size=8, epsilon=eps, expected_owners=["a"])
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "at most 1000" in ei.value.details


def test_cli_details_a_new_user_hits(cluster: Cluster, tmp_path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from parties.cli import _verbosity_first, main

    # -v works after the subcommand too.
    assert _verbosity_first(["status", "s1", "-vv", "--insecure"]) == ["-vv", "status", "s1", "--insecure"]
    # query --list on an unknown study says so (and fails) instead of "no finished releases".
    assert main(["query", "--list", "--study", "nope", "--analyst", cluster.cs.target, "--insecure"]) == 1
    assert "unknown study 'nope'" in capsys.readouterr().err
    # demo --plot without matplotlib fails before running the demo, not after it.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--plot", "x.png", "--insecure"]) == 1
    err = capsys.readouterr()
    assert "--plot needs matplotlib" in err.err and "range counts" not in err.out


def test_zero_ranges_is_an_error_for_both_range_rpcs(cluster: Cluster) -> None:
    import numpy as np

    from parties.common.errors import ServiceError

    cluster.open_study(domain_size=16, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(16))
    rel = cluster.computation().run_release("s1", epsilon=0.5)
    for call in (lambda: cluster.analyst().range_counts(rel.release_id, []),
                 lambda: cluster.computation().direct_range_counts("s1", [], 0.1)):
        with pytest.raises((ServiceError, InvalidInputError)) as ei:
            call()
        assert "ranges is empty" in str(ei.value)


def test_query_prints_ranges_in_the_domains_values(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from parties.cli import main

    cluster.open_study(domain_size=50, owners=("a",), epsilon=1.0, domain_spec="age:0:100:50")
    cluster.owner("a").submit("s1", np.arange(50))
    rel = cluster.computation().run_release("s1", epsilon=1.0)
    assert main(["query", rel.release_id, "--range", "0:10", "--analyst", cluster.cs.target, "--insecure"]) == 0
    assert "bins [0, 10) = age in [0, 20):" in capsys.readouterr().out


def test_reflection_is_served_as_v1_and_v1alpha(cluster: Cluster) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with grpc.insecure_channel(cluster.cs.target) as channel:
        for package in ("grpc.reflection.v1", "grpc.reflection.v1alpha"):
            call = channel.stream_stream(f"/{package}.ServerReflection/ServerReflectionInfo",
                                         request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                         response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
            (resp,) = list(call(iter([request]), timeout=5))
            names = {s.name for s in resp.list_services_response.service}
            assert "dpagg.v1.Computation" in names and "grpc.reflection.v1.ServerReflection" in names


def test_careless_csvs_are_refused_before_anything_is_sent(cluster: Cluster, tmp_path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from parties.cli import main

    cluster.open_study(domain_size=10, owners=("a",), epsilon=1.0, domain_spec="age:0:100:10")
    base = ["submit", "--study", "s1", "--owner", "a", "--computation", cluster.cs.target, "--decryption",
            cluster.ds.target, "--insecure", "--no-progress", "--state-dir", str(tmp_path / "state")]
    empty = tmp_path / "empty.csv"
    empty.write_text("age\n")
    assert main([*base, "--csv", str(empty)]) == 1
    assert "refusing an empty submission" in capsys.readouterr().err
    wrong = tmp_path / "months.csv"  # ages in months: 60% beyond the domain
    wrong.write_text("age\n" + "\n".join(["30", "40", "50", "40", "700", "800", "900", "600", "650", "720"]) + "\n")
    assert main([*base, "--csv", str(wrong)]) == 1
    assert "6 of 10 records (60%) fall outside the domain" in capsys.readouterr().err
    assert cluster.computation().study_status("s1").submitted_owners == ()  # nothing was committed
    assert main([*base, "--csv", str(wrong), "--accept-out-of-domain"]) == 0
    assert cluster.computation().study_status("s1").submitted_owners == ("a",)


def test_every_subcommand_and_flag_has_help() -> None:
    """`dpagg X --help` explains X and each of its flags (a new user's first stop)."""
    import argparse

    from parties.cli import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                for name, sub in action.choices.items():
                    if not helps.get(name) or not sub.description:
                        missing.append(f"{path} {name}")
                    walk(sub, f"{path} {name}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "dpagg")
    assert missing == []
