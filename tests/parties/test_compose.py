"""Static checks of the compose deployment (no Docker daemon here): it must run real `dpagg` commands."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from parties.cli import build_parser

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse compose/docker-compose.yml")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_every_service_runs_a_valid_dpagg_command_from_the_one_image(compose: dict[str, Any]) -> None:
    parser = build_parser()
    services = compose["services"]
    assert {"decryption", "computation", "open-study", "owner-1", "owner-2", "owner-3", "release", "query"} <= set(services)
    built = [name for name, svc in services.items() if "build" in svc]
    assert built == ["pki"], "exactly one service builds the image; the others run it"
    svc = services["pki"]
    assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DOCKERFILE
    for name, svc in services.items():
        assert svc["image"] == "dpagg:local", name
        if name != "pki":
            assert svc["pull_policy"] == "never", name
        cmd = [c.replace("${DPAGG_STUDY:-demo}", "demo") for c in svc["command"]]
        assert cmd[0] == "dpagg", name
        parser.parse_args(cmd[1:])  # exits (fails the test) on an unknown subcommand or flag
        if "healthcheck" in svc:
            test = svc["healthcheck"]["test"]
            assert test[:2] == ["CMD", "dpagg"]
            parser.parse_args(test[2:])
            assert "start_period" in svc["healthcheck"], name


def test_every_container_is_hardened(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        assert svc["read_only"] is True, name
        assert svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert svc["user"] == "10001:10001", name
        assert svc.get("mem_limit"), name
        assert "/tmp" in svc["tmpfs"], name
    jobs = [n for n, s in compose["services"].items() if n not in ("pki", "decryption", "computation")]
    assert all(compose["services"][j].get("profiles") == ["demo"] for j in jobs), "demo jobs belong in a profile"


def test_each_party_mounts_only_its_own_keys(compose: dict[str, Any]) -> None:
    """The CA key volume is the pki job's alone; every other service mounts exactly one pki-<party> volume."""
    services = compose["services"]
    mounts = {name: [v.split(":")[0] for v in svc.get("volumes", [])] for name, svc in services.items()}
    assert [n for n, vols in mounts.items() if "ca" in vols] == ["pki"]
    party_of = {"decryption": "decryption", "computation": "computation", "open-study": "operator",
                "release": "operator", "query": "analyst", "owner-1": "owner-1", "owner-2": "owner-2",
                "owner-3": "owner-3"}
    for name, party in party_of.items():
        pki = [v for v in mounts[name] if v.startswith("pki-")]
        assert pki == [f"pki-{party}"], f"{name} mounts {pki}"
        assert any(v == f"pki-{party}:/pki:ro" for v in services[name]["volumes"]), name
    for n in (1, 2, 3):  # an owner's private volume (signing key, upload state, data) is mounted by it alone
        users = sorted(name for name, vols in mounts.items() if f"owner-{n}" in vols)
        assert users == sorted([f"owner-{n}", f"owner-{n}-keygen", "sample-data"]), users
    assert "--signing-keys" not in services["pki"]["command"]  # owners create their own signing keys


def test_networks_keep_the_key_holder_behind_the_computation_server(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert compose["networks"]["backend"]["internal"] is True
    assert services["decryption"]["networks"] == ["backend"] and "ports" not in services["decryption"]
    assert sorted(services["computation"]["networks"]) == ["backend", "frontend"]
    for name, svc in services.items():
        if name in ("decryption", "computation"):
            continue
        assert "backend" not in svc.get("networks", []), f"{name} must not reach the decryption server"
        if svc.get("network_mode") != "none":
            assert svc["networks"] == ["frontend"], name
    for name in ("pki", "sample-data", "owner-1-keygen"):
        assert services[name]["network_mode"] == "none", name


def test_image_is_reproducible_and_lean() -> None:
    text = DOCKERFILE.read_text()
    lock = (ROOT / "compose" / "requirements.lock").read_text().splitlines()
    pins = [line for line in lock if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][^ ]*", p) for p in pins), pins
    assert not any(p.lower().startswith("matplotlib") for p in pins)
    assert "[plot]" not in text
    assert text.index("requirements.lock") < text.index("COPY parties"), "dependency layer before the source"
    assert "pip install --no-deps ." in text
    ignore = (ROOT / ".dockerignore").read_text()
    assert "**" in ignore.splitlines() and "!parties/" in ignore


def test_addresses_dependencies_and_volumes_are_consistent(compose: dict[str, Any]) -> None:
    services = compose["services"]
    listening = {name: _flag(svc["command"], "--port") for name, svc in services.items()
                 if svc["command"][1].startswith("serve-")}
    assert listening == {"decryption": "50051", "computation": "50052"}
    for name, svc in services.items():
        cmd = svc["command"]
        for flag in ("--computation", "--decryption", "--analyst"):
            target = _flag(cmd, flag)
            if target is None:
                continue
            host, port = target.split(":")
            assert listening.get(host) == port, f"{name}: {flag} {target} does not match a server"
            assert host in _deps(svc) or _reaches(services, name, host), f"{name} must start after {host}"
        for dep, spec in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert spec["condition"] in ("service_healthy", "service_completed_successfully", "service_started")
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep]
        for vol in svc.get("volumes", []):
            assert vol.split(":")[0] in compose["volumes"], f"{name}: undeclared volume {vol}"
        if cmd[1] in ("serve-decryption", "serve-computation"):
            assert _flag(cmd, "--host") == "0.0.0.0" and _flag(cmd, "--data-dir") == "/data"
            assert any(v.endswith(":/data") for v in svc["volumes"]), f"{name} must keep its state on a volume"
    study = _flag(services["open-study"]["command"], "--study-id")
    owners = _flag(services["open-study"]["command"], "--owners").split(",")  # type: ignore[union-attr]
    submitted = [_flag(services[o]["command"], "--owner") for o in owners]
    assert submitted == owners
    assert all(_flag(services[o]["command"], "--study") == study for o in owners)
    assert set(_deps(services["release"])) == set(owners)


def _deps(svc: dict[str, Any]) -> list[str]:
    return list(svc.get("depends_on", {}))


def _reaches(services: dict[str, Any], start: str, goal: str) -> bool:
    todo, seen = [start], set()
    while todo:
        s = todo.pop()
        if s == goal:
            return True
        if s not in seen:
            seen.add(s)
            todo += _deps(services[s])
    return False


def test_dockerfile_installs_the_packages_and_runs_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    copied = re.findall(r"^COPY (.+) \S+$", text, re.M)
    sources = [s for line in copied for s in line.split()]
    for src in sources:
        if src != "README.md":  # README.md is written by the docs task; pip needs it at build time
            assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    assert {"he_partition", "parties", "dpagg", "pyproject.toml"} <= set(sources)
    assert re.search(r"^RUN pip install", text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M)


def test_every_networked_service_uses_mutual_tls_with_its_own_certificate(compose: dict[str, Any]) -> None:
    """No plaintext anywhere: each party presents the certificate `dpagg certs` issued for its service name."""
    services = compose["services"]
    pki_cmd = services["pki"]["command"]
    assert pki_cmd[:2] == ["dpagg", "certs"] and "--per-party-dirs" in pki_cmd and "--keep-existing" in pki_cmd
    assert _flag(pki_cmd, "--ca") == "/ca"
    issued = dict(pki_cmd[i + 1].split(":")[:2] for i, a in enumerate(pki_cmd) if a == "--party")
    expected_role = {"decryption": "decryption", "computation": "computation", "open-study": "operator",
                     "release": "operator", "query": "analyst", "owner-1": "data_owner", "owner-2": "data_owner",
                     "owner-3": "data_owner"}
    for name, role in expected_role.items():
        svc = services[name]
        assert "--insecure" not in svc["command"], name
        env = svc["environment"]
        party = env["DPAGG_CERT"].removeprefix("/pki/").removesuffix(".crt")
        assert env == {"DPAGG_CA_CERT": "/pki/dpagg-ca.crt", "DPAGG_CERT": f"/pki/{party}.crt",
                       "DPAGG_KEY": f"/pki/{party}.key"}, name
        assert issued.get(party) == role, f"{name} uses {party}'s certificate, which is not a {role}"
        assert _reaches(services, name, "pki"), f"{name} must start after the certificates exist"
    for o in ("owner-1", "owner-2", "owner-3"):  # every owner signs with its own key, listed in the contract
        assert _flag(services[o]["command"], "--signing-key") == f"/owner/{o}.signing.key"
        keygen = services[f"{o}-keygen"]["command"]
        assert keygen[:2] == ["dpagg", "keygen"] and _flag(keygen, "--out") == f"/owner/{o}.signing.key"
        assert "--keep-existing" in keygen and _flag(keygen, "--public-dir") == "/owner-keys"
    assert _flag(services["open-study"]["command"], "--owner-keys-dir") == "/owner-keys"
    # the servers serve under their service names, which `dpagg certs` puts in the certificates by default
    assert _flag(services["decryption"]["command"], "--computation-id") == "computation"
