"""Static checks of the compose `threshold` profile (compose/threshold.yml): three key-share holders, each alone."""

from __future__ import annotations

import re

from pathlib import Path
from typing import Any

import pytest

from parties.cli import build_parser

from .test_compose import backup_loop_command, check_limits_and_logging

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse the compose files")

ROOT = Path(__file__).resolve().parents[2]
THRESHOLD_YML = ROOT / "compose" / "threshold.yml"
BASE_YML = ROOT / "compose" / "docker-compose.yml"
HOLDERS = ("holder-1", "holder-2", "holder-3")


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader that reads Compose's merge tags (`!override`, `!reset`) as the plain value they carry."""


def _untag(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


for _tag in ("!override", "!reset"):
    _ComposeLoader.add_constructor(_tag, _untag)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded = yaml.load(THRESHOLD_YML.read_text(), Loader=_ComposeLoader)  # noqa: S506 (SafeLoader subclass)
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    loaded = yaml.safe_load(BASE_YML.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _flag(cmd: list[str], name: str) -> str:
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]


def _flags(cmd: list[str], name: str) -> list[str]:
    return [cmd[i + 1] for i, c in enumerate(cmd) if c == name]


def test_every_new_service_runs_a_valid_dpagg_command_and_is_hardened(doc: dict[str, Any]) -> None:
    parser = build_parser()
    services = doc["services"]
    assert {"holder-pki", *HOLDERS, "setup-key", "computation"} <= set(services)
    for name in ("holder-pki", *HOLDERS, "setup-key"):
        svc = services[name]
        assert svc["profiles"] == ["threshold"], name
        assert svc["image"] == "dpagg:local" and svc["pull_policy"] == "never", name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"] and svc["user"] == "10001:10001", name
        assert svc.get("mem_limit") and "/tmp" in svc["tmpfs"], name
        assert "ports" not in svc, f"{name} publishes no port"
    for name in ("holder-pki", *HOLDERS, "setup-key", "computation"):
        cmd = [re.sub(r"\$\{DPAGG_[A-Z_]+:-([^}]*)\}", r"\1", c) for c in services[name]["command"]]  # defaults
        assert cmd[0] == "dpagg", name
        parser.parse_args(cmd[1:])  # exits (fails the test) on an unknown subcommand or flag
    assert services["setup-key"]["command"][-2:] == ["--threshold", "${DPAGG_KEY_THRESHOLD:-0}"]  # N-of-N unless set
    for name in HOLDERS:
        test = services[name]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "dpagg"] and "dpagg.v1.Decryption" in test
        parser.parse_args(test[2:])
    assert services["holder-pki"]["network_mode"] == "none"


def test_each_holder_is_alone_on_its_own_internal_network_with_the_computation_server(doc: dict[str, Any],
                                                                                      base: dict[str, Any]) -> None:
    services = doc["services"]
    nets = {name: f"{name}-net" for name in HOLDERS}
    for name, net in nets.items():
        assert doc["networks"][net]["internal"] is True, f"{net} has no route out"
        assert services[name]["networks"] == [net], f"{name} is on its own network only"
    cs_nets = services["computation"]["networks"]
    assert sorted(cs_nets) == sorted(["frontend", *nets.values()]), "the CS reaches the owners and every holder"
    assert "backend" not in cs_nets
    # Nobody else joins a holder's network: not another holder, not an owner, not the operator.
    every = {**base["services"], **services}
    for name, svc in every.items():
        if name in ("computation", *HOLDERS):
            continue
        joined = svc.get("networks", [])
        if name in JOIN_OWNERS:  # a join study's owners evaluate their pseudonyms at the holders (profile join)
            assert svc["profiles"] == ["join"] and sorted(joined) == sorted(["frontend", *nets.values()]), name
            continue
        assert not set(joined) & set(nets.values()), f"{name} joins a holder's network"
    # The single-key server does not run in this profile.
    assert services["decryption"]["profiles"] == ["single-key"]


def test_each_holder_has_its_own_certificate_volume_and_ledger(doc: dict[str, Any], base: dict[str, Any]) -> None:
    services = doc["services"]
    pki = services["holder-pki"]
    issued = _flags(pki["command"], "--party")
    assert issued == [f"{h}:decryption" for h in HOLDERS], "each holder: its own certificate, role decryption"
    assert "ca:/ca" in pki["volumes"] and "--keep-existing" in pki["command"]
    assert pki["depends_on"]["pki"]["condition"] == "service_completed_successfully"  # the CA exists first
    for h in HOLDERS:
        assert f"pki-{h}:/pki/{h}" in pki["volumes"]
        svc = services[h]
        # its data, its certificate, and the operator's approval public key it pins (read-only)
        assert sorted(svc["volumes"]) == sorted([f"{h}-data:/data", f"pki-{h}:/pki:ro",
                                                 "operator-public:/operator-public:ro"]), h
        assert svc["command"][svc["command"].index("--operator-key") + 1] == "/operator-public/operator.approval.pub"
        assert svc["environment"] == {"DPAGG_CA_CERT": "/pki/dpagg-ca.crt", "DPAGG_CERT": f"/pki/{h}.crt",
                                      "DPAGG_KEY": f"/pki/{h}.key", "TMPDIR": "/run/dpagg-lib"}  # the OPRF's libsodium
        assert any(t.startswith("/run/dpagg-lib:exec") for t in svc["tmpfs"]) and "/tmp" in svc["tmpfs"]
    every = {**base["services"], **services}
    for vol in [f"{h}-data" for h in HOLDERS] + [f"pki-{h}" for h in HOLDERS]:
        users = sorted(n for n, s in every.items() if any(v.split(":")[0] == vol for v in s.get("volumes", [])))
        owner = vol.removesuffix("-data").removeprefix("pki-")
        also = ["holder-pki"] if vol.startswith("pki-") else [f"{owner}-ledger-backup"]  # read-only, below
        assert users == sorted({owner, *also}), (vol, users)
    assert sorted(n for n, s in every.items() if "ca:/ca" in s.get("volumes", [])) == ["holder-pki", "pki"]


def test_holders_and_the_computation_server_name_the_same_three_holders(doc: dict[str, Any]) -> None:
    services = doc["services"]
    for h in HOLDERS:
        cmd = services[h]["command"]
        assert cmd[:2] == ["dpagg", "serve-decryption"]
        assert _flag(cmd, "--key-share") == h, "a holder's name is its certificate's identity"
        assert _flag(cmd, "--holders").split(",") == list(HOLDERS)
        assert _flag(cmd, "--computation-id") == "computation"
        assert _flag(cmd, "--port") == "50051"
    cs = services["computation"]
    assert "--decryption" not in cs["command"]
    assert _flags(cs["command"], "--holder") == [f"{h}={h}:50051" for h in HOLDERS]
    assert set(cs["depends_on"]) == set(HOLDERS)
    assert all(d["condition"] == "service_healthy" for d in cs["depends_on"].values())


def test_key_setup_runs_as_the_operator_before_the_study_is_opened(doc: dict[str, Any]) -> None:
    services = doc["services"]
    setup = services["setup-key"]
    assert setup["command"][:2] == ["dpagg", "setup-key"]
    assert _flag(setup["command"], "--computation") == "computation:50052"
    assert setup["networks"] == ["frontend"]
    assert setup["volumes"] == ["pki-operator:/pki:ro"]
    assert setup["environment"]["DPAGG_CERT"] == "/pki/operator.crt"
    assert setup["depends_on"]["computation"]["condition"] == "service_healthy"
    assert services["open-study"]["depends_on"]["setup-key"]["condition"] == "service_completed_successfully"


def test_the_dockerfile_owns_the_holders_certificate_mount_points() -> None:
    """holder-pki mounts /pki/holder-N: a named volume takes the image directory's owner (uid 10001) only if it exists."""
    text = (ROOT / "compose" / "Dockerfile").read_text()
    line = text[text.index("for p in decryption"):]
    line = line[:line.index("done")]
    assert all(h in line.replace(";", " ").split() for h in HOLDERS), line


def test_every_service_of_the_profile_has_rotated_logs_and_overridable_limits(doc: dict[str, Any]) -> None:
    services = doc["services"]
    new = [n for n, s in services.items() if s.get("profiles") == ["threshold"]]
    assert {"holder-pki", *HOLDERS, "setup-key", *(f"{h}-ledger-backup" for h in HOLDERS)} <= set(new)
    limits = {name: check_limits_and_logging(name, services[name]) for name in new}
    for h in HOLDERS:  # a holder does the key holder's work on its share: as much memory as the single one
        assert limits[h]["memory"] >= 2.5 * 2**30 and limits[h]["pids"] > limits["setup-key"]["pids"], h


def test_each_holders_ledger_is_backed_up_on_a_schedule_to_its_own_volume(doc: dict[str, Any],
                                                                          base: dict[str, Any]) -> None:
    """holder-N-ledger-backup: the base file's backup loop on holder N's ledger, into holder-N-ledger-backups."""
    services = doc["services"]
    assert services["ledger-backup"]["profiles"] == ["single-key"], "the single key holder's backup stays off"
    every = {**base["services"], **services}
    for h in HOLDERS:
        svc = services[f"{h}-ledger-backup"]
        assert backup_loop_command(svc) == backup_loop_command(base["services"]["ledger-backup"])
        assert svc["profiles"] == ["threshold"]
        assert svc["volumes"] == [f"{h}-data:/data:ro", f"{h}-ledger-backups:/backups"], h
        assert svc["depends_on"] == {h: {"condition": "service_healthy"}}
        assert f"{h}-ledger-backups" in doc["volumes"]
        users = sorted(n for n, s in every.items()
                       if any(v.split(":")[0] == f"{h}-ledger-backups" for v in s.get("volumes", [])))
        assert users == [f"{h}-ledger-backup"], users
        assert svc["image"] == "dpagg:local" and svc["read_only"] is True and svc["user"] == "10001:10001"


JOIN_OWNERS = ("join-owner-1", "join-owner-2")


def test_the_join_owners_submit_with_the_three_holders_in_holder_order(doc: dict[str, Any]) -> None:
    """Profile join: each join owner's script runs a valid `dpagg join-submit` naming holder-1..3 in order."""
    import shlex

    parser = build_parser()
    for name in JOIN_OWNERS:
        svc = doc["services"][name]
        assert svc["command"][:2] == ["sh", "-c"] and svc["read_only"] is True and svc["user"] == "10001:10001"
        script = svc["command"][2].replace("\\\n", " ")
        line = next(x for x in script.splitlines() if x.strip().startswith("exec dpagg join-submit"))
        argv = shlex.split(re.sub(r"\$\{DPAGG_[A-Z_]+:-([^}]*)\}", r"\1", line))[2:]
        args = parser.parse_args(argv)
        assert args.key_holders == [f"{h}:50051" for h in HOLDERS], name
        assert args.owner == name.removeprefix("join-")
