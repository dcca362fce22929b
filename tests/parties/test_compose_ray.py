"""Static checks of the compose `ray` profile (compose/ray.yml): Ray nodes under TLS from the deployment's CA, on their own network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parties.cli import build_parser

from .test_compose import check_limits_and_logging

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse the compose files")

ROOT = Path(__file__).resolve().parents[2]
RAY_YML = ROOT / "compose" / "ray.yml"
BASE_YML = ROOT / "compose" / "docker-compose.yml"
NODES = ("ray-head", "ray-worker")


@pytest.fixture(scope="module")
def ray_doc() -> dict[str, Any]:
    doc = yaml.safe_load(RAY_YML.read_text())
    assert isinstance(doc, dict)
    return doc


def _ip(svc: dict[str, Any]) -> str:
    return str(svc["networks"]["ray"]["ipv4_address"])


def _flag(cmd: list[str], name: str) -> str:
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]


def _issued(ray_doc: dict[str, Any]) -> dict[str, list[str]]:
    """Ray node id -> the host names / IPs the ray-pki job puts in its certificate."""
    cmd = ray_doc["services"]["ray-pki"]["command"]
    build_parser().parse_args(cmd[1:])  # a real `dpagg certs` command line
    out = {}
    for i, c in enumerate(cmd):
        if c == "--ray-node":
            node, _, hosts = cmd[i + 1].partition(":")
            out[node] = hosts.split(",")
    return out


def test_ray_services_are_in_the_profile_and_hardened(ray_doc: dict[str, Any]) -> None:
    services = ray_doc["services"]
    assert {"ray-pki", *NODES} <= set(services)
    for name in ("ray-pki", *NODES):
        svc = services[name]
        assert svc["profiles"] == ["ray"], name
        assert svc["image"] == "dpagg-ray:local" and svc["pull_policy"] == "never", name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"] and svc["user"] == "10001:10001", name
        assert svc.get("mem_limit") and "/tmp" in svc["tmpfs"], name
        assert "ports" not in svc, f"{name} publishes no port"
    assert services["ray-pki"]["network_mode"] == "none"


def test_ray_nodes_are_on_their_own_internal_network(ray_doc: dict[str, Any]) -> None:
    base = yaml.safe_load(BASE_YML.read_text())
    net = ray_doc["networks"]["ray"]
    assert net["internal"] is True
    subnet = net["ipam"]["config"][0]["subnet"]
    prefix = subnet.rsplit(".", 1)[0] + "."
    for name in NODES:
        svc = ray_doc["services"][name]
        assert list(svc["networks"]) == ["ray"], f"{name} reaches only the other Ray nodes and the driver"
        assert _ip(svc).startswith(prefix)
    assert "ray" not in base["services"]["decryption"]["networks"]
    assert "decryption" not in ray_doc["services"], "the key holder stays off the Ray network"


def test_every_ray_process_uses_tls_with_its_own_certificate_from_the_ca(ray_doc: dict[str, Any]) -> None:
    services = ray_doc["services"]
    issued = _issued(ray_doc)
    pki_volumes = {v.split(":")[1].rsplit("/", 1)[1]: v.split(":")[0] for v in services["ray-pki"]["volumes"]
                   if v.split(":")[1].startswith("/pki/")}
    assert "ca:/ca" in services["ray-pki"]["volumes"]
    for name, node_id in (("ray-head", "ray-head"), ("ray-worker", "ray-worker"), ("computation", "computation-ray")):
        svc = services[name]
        env = svc["environment"]
        assert env["RAY_USE_TLS"] == "1", name
        assert env["RAY_TLS_SERVER_CERT"] == f"/ray-tls/{node_id}.crt", name
        assert env["RAY_TLS_SERVER_KEY"] == f"/ray-tls/{node_id}.key", name
        assert env["RAY_TLS_CA_CERT"] == "/ray-tls/dpagg-ca.crt", name
        assert f"{pki_volumes[node_id]}:/ray-tls:ro" in svc["volumes"], f"{name} mounts only its own Ray key"
        assert _ip(svc) in issued[node_id], f"{name}'s certificate names the address it is reached at"
        others = [v for n, v in pki_volumes.items() if n != node_id]
        assert not any(v.split(":")[0] in others for v in svc["volumes"]), name


def test_addresses_agree_and_the_cs_is_a_tls_ray_client(ray_doc: dict[str, Any]) -> None:
    services = ray_doc["services"]
    head, worker, cs = services["ray-head"], services["ray-worker"], services["computation"]
    assert _flag(head["command"], "--node-ip-address") == _ip(head)
    assert _flag(worker["command"], "--node-ip-address") == _ip(worker)
    assert _flag(worker["command"], "--address") == f"{_ip(head)}:{_flag(head['command'], '--port')}"
    assert "--include-dashboard=false" in head["command"]
    cmd = cs["command"]
    args = build_parser().parse_args(cmd[1:])
    assert args.cluster == f"ray://{_ip(head)}:{_flag(head['command'], '--ray-client-server-port')}"
    assert cs["image"] == "dpagg-ray:local"
    # The Ray nodes read the stored uploads at the CS's path, read-only; never the key holder's data.
    for name in NODES:
        vols = services[name]["volumes"]
        assert "computation-data:/data:ro" in vols, name
        assert not any(v.startswith(("decryption-data", "ca:")) for v in vols), name


def test_the_dockerfile_can_add_ray_and_owns_the_new_mount_points() -> None:
    text = (ROOT / "compose" / "Dockerfile").read_text()
    assert 'ARG DPAGG_RAY=""' in text and 'pip install "$DPAGG_RAY"' in text
    for mount in ("ray-head", "ray-worker", "computation-ray", "/ray-tls"):
        assert mount in text


def test_ray_services_have_rotated_logs_and_overridable_limits(ray_doc: dict[str, Any]) -> None:
    services = ray_doc["services"]
    limits = {name: check_limits_and_logging(name, services[name]) for name in ("ray-pki", *NODES)}
    for name in NODES:  # Ray starts many processes and threads per node
        assert limits[name]["pids"] >= 1024 and limits[name]["memory"] >= 2**30, name
        assert services[name]["mem_limit"].startswith("${DPAGG_RAY_MEMORY:-"), name


def test_the_worker_is_healthy_only_once_registered_and_the_cs_waits_for_it(ray_doc: dict[str, Any]) -> None:
    services = ray_doc["services"]
    head, worker = services["ray-head"], services["ray-worker"]
    check = worker["healthcheck"]
    assert check["test"][:3] == ["CMD", "python", "-c"] and "start_period" in check
    code = check["test"][3]
    compile(code, "ray-worker healthcheck", "exec")
    head_gcs = f"{_ip(head)}:{_flag(head['command'], '--port')}"
    assert f"GcsClient(address='{head_gcs}')" in code, "asks the head's GCS"
    assert f"node_manager_address == '{_ip(worker)}'" in code and "ALIVE" in code, "about this node, alive"
    assert services["computation"]["depends_on"]["ray-worker"]["condition"] == "service_healthy"
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
