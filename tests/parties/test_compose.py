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
        if name == "ledger-backup":  # a shell loop around `dpagg ledger backup` (test_the_ledger_is_backed_up_...)
            continue
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
    jobs = [n for n, s in compose["services"].items()
            if n not in ("pki", "operator-keygen", "decryption", "computation", "ledger-backup")]
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


def test_the_key_holder_pins_the_operators_approval_key_whose_private_half_only_the_operator_mounts(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    users = sorted(n for n, svc in services.items()
                   if any(v.split(":")[0] == "operator-approval" for v in svc.get("volumes", [])))
    assert users == ["open-study", "operator-keygen"]
    assert "operator-approval:/operator:ro" in services["open-study"]["volumes"]
    assert _flag(services["open-study"]["command"], "--approval-key") == "/operator/operator.approval.key"
    ds = services["decryption"]
    assert _flag(ds["command"], "--operator-key") == "/operator-public/operator.approval.pub"
    assert "operator-public:/operator-public:ro" in ds["volumes"]
    assert ds["depends_on"]["operator-keygen"]["condition"] == "service_completed_successfully"
    assert services["operator-keygen"]["network_mode"] == "none"


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
    for name in ("pki", "sample-data", "owner-1-keygen", "ledger-backup"):
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
                 if svc["command"][0] == "dpagg" and svc["command"][1].startswith("serve-")}
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
        if cmd[0] == "dpagg" and cmd[1] in ("serve-decryption", "serve-computation"):
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
        env = dict(svc["environment"])
        if name == "decryption":  # the OPRF's libsodium is loaded from TMPDIR: its own small exec tmpfs
            assert env.pop("TMPDIR") == "/run/dpagg-lib"
            assert any(t.startswith("/run/dpagg-lib:exec") for t in svc["tmpfs"]) and "/tmp" in svc["tmpfs"]
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


_ENV_DEFAULT = re.compile(r"\$\{(DPAGG_[A-Z_]+):-([^}]+)\}")


def env_default(value: object, what: str) -> tuple[str, str]:
    """(variable, default) of a compose value written `${DPAGG_X:-default}`: set by the operator, with a default."""
    m = _ENV_DEFAULT.fullmatch(str(value))
    assert m, f"{what} is {value!r}, not ${{DPAGG_...:-default}}"
    return m.group(1), m.group(2)


def _bytes(size: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    return int(float(size[:-1]) * units[size[-1].lower()]) if size[-1].lower() in units else int(size)


def check_limits_and_logging(name: str, svc: dict[str, Any]) -> dict[str, float]:
    """A service's rotated json-file logs and its memory, CPU and process-count limits (each `${DPAGG_X:-default}`).

    Returns the defaults: memory in bytes, cpus, pids. `cpus` above the host's CPU count makes Docker refuse to
    create the container, so each default fits a 2-CPU host (operators raise them on bigger ones)."""
    log = svc.get("logging")
    assert log and log["driver"] == "json-file", f"{name}: logs are not json-file"
    size = env_default(log["options"]["max-size"], f"{name} max-size")
    files = env_default(log["options"]["max-file"], f"{name} max-file")
    assert size == ("DPAGG_LOG_MAX_SIZE", "10m") and files == ("DPAGG_LOG_MAX_FILE", "5"), name
    memory = _bytes(env_default(svc.get("mem_limit"), f"{name} mem_limit")[1])
    cpus = float(env_default(svc.get("cpus"), f"{name} cpus")[1])
    pids = int(env_default(svc.get("pids_limit"), f"{name} pids_limit")[1])
    assert 128 * 2**20 <= memory <= 8 * 2**30, (name, memory)
    assert 0 < cpus <= 2, f"{name}: default cpus {cpus} would not start on a 2-CPU host"
    assert 32 <= pids <= 4096, (name, pids)
    return {"memory": memory, "cpus": cpus, "pids": pids}


def test_every_service_has_rotated_logs_and_overridable_limits(compose: dict[str, Any]) -> None:
    limits = {name: check_limits_and_logging(name, svc) for name, svc in compose["services"].items()}
    servers = {name: limits[name] for name in ("decryption", "computation")}
    assert max(limits, key=lambda n: limits[n]["memory"]) == "computation", "the CS needs the most memory"
    assert servers["decryption"]["memory"] >= 2.5 * 2**30, "the key holder peaks at 2.3 GB (docs/scaling.md)"
    for name in ("decryption", "computation"):
        assert servers[name]["cpus"] >= limits["query"]["cpus"] and servers[name]["pids"] > limits["query"]["pids"]
    names = {env_default(svc[key], key)[0] for svc in compose["services"].values() for key in ("mem_limit", "cpus")}
    assert {"DPAGG_CS_MEMORY", "DPAGG_CS_CPUS", "DPAGG_DS_MEMORY", "DPAGG_DS_CPUS", "DPAGG_JOB_MEMORY"} <= names
    readme = (ROOT / "compose" / "README.md").read_text()
    assert all(n in readme for n in names | {"DPAGG_LOG_MAX_SIZE", "DPAGG_CS_PIDS"}), "the README names each knob"


def backup_loop_command(svc: dict[str, Any]) -> str:
    """The script of a ledger-backup service (`sh -c SCRIPT`), checked to run the project's own backup command."""
    cmd = svc["command"]
    assert cmd[:2] == ["sh", "-c"] and len(cmd) == 3, cmd
    script = str(cmd[2])
    line = next(ln.strip() for ln in script.splitlines() if "dpagg ledger backup" in ln)
    args = line[line.index("dpagg ledger backup"):].split(";")[0].removesuffix("then").split()
    out = _flag(args, "--out")
    assert out is not None and out.startswith("/backups/") and _flag(args, "--data-dir") == "/data", line
    build_parser().parse_args([a.replace("$$", "$") for a in args[1:]])
    assert "mv /backups/.partial-" in script, "a copy is renamed to ledger-*.sqlite3 only once verified"
    assert "sleep" in script and "$$DPAGG_BACKUP_INTERVAL" in script and "$$DPAGG_BACKUP_KEEP" in script
    assert env_default(svc["environment"]["DPAGG_BACKUP_INTERVAL"], "interval") == ("DPAGG_BACKUP_INTERVAL", "3600")
    assert env_default(svc["environment"]["DPAGG_BACKUP_KEEP"], "keep")[0] == "DPAGG_BACKUP_KEEP"
    assert svc["network_mode"] == "none" and svc["restart"] == "unless-stopped"
    assert "healthcheck" in svc and "start_period" in svc["healthcheck"]
    return script


def test_the_ledger_is_backed_up_on_a_schedule_to_a_volume_of_its_own(compose: dict[str, Any]) -> None:
    """`ledger-backup` copies the key holder's ledger with `dpagg ledger backup` into `ledger-backups`, a volume
    holding no key: the key holder's own volume (the BFV secret key) is mounted read-only, and nothing else
    mounts the backups."""
    services = compose["services"]
    svc = services["ledger-backup"]
    assert "profiles" not in svc, "it runs with the servers, not only in the demo"
    backup_loop_command(svc)
    assert svc["volumes"] == ["decryption-data:/data:ro", "ledger-backups:/backups"]
    assert svc["depends_on"] == {"decryption": {"condition": "service_healthy"}}
    assert "ledger-backups" in compose["volumes"]
    users = sorted(n for n, s in services.items() if any(v.split(":")[0] == "ledger-backups" for v in s.get("volumes", [])))
    assert users == ["ledger-backup"], users
    assert not any(v.split(":")[0] == "ledger-backups" for v in services["decryption"]["volumes"])
    text = DOCKERFILE.read_text()  # the mount point exists and is the service user's, so the new volume is too
    assert re.search(r"mkdir -p [^\n]*/backups", text) and re.search(r"chown -R dpagg [^\n]*/backups", text)
