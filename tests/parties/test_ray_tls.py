"""A Ray cluster under TLS from the deployment's CA: a release through it equals in-process; clients without the CA's certificates cannot join."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parties.common import tls
from parties.common.pki import create_ca
from parties.common.ray_tls import RayNodeFiles, issue_ray_node_certificate, ray_tls_env

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # a Ray head, a driver release and three refused clients: about 35 s

ROOT = Path(__file__).resolve().parents[2]

# The driver: the executor tests' seeded release (4 chunks, 3 owners, 2 measurements) on the TLS cluster
# through RayExecutor, and on the in-process executor; prints both as JSON.
DRIVER = """
import json, sys, tempfile
from pathlib import Path
from he_partition.execution import InProcessExecutor
from he_partition.execution.ray_cluster import RayExecutor
from tests.he_partition.test_execution import Keys, _release
keys = Keys(Path(tempfile.mkdtemp(dir=sys.argv[2])))
executor = RayExecutor(2, address=sys.argv[1])
on_ray = _release(keys, executor, 17)
executor.close()
local = _release(keys, InProcessExecutor(), 17)
print("RESULT " + json.dumps({"ray": [a.tolist() for a in on_ray], "inprocess": [a.tolist() for a in local]}))
"""

# The computation server's own private Ray (no address) started under TLS, a release through it, and a
# plain client pointed at that Ray's GCS (it must not connect).
PRIVATE = """
import json, os, subprocess, sys, tempfile, time
from pathlib import Path
import ray
from he_partition.execution import InProcessExecutor, make_executor
from tests.he_partition.test_execution import Keys, _release
keys = Keys(Path(tempfile.mkdtemp(dir=sys.argv[1])))
executor = make_executor("ray", workers=2, node_ip="127.0.0.1")
on_ray = _release(keys, executor, 29)
gcs = ray.get_runtime_context().gcs_address
plain_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_TLS") and k != "RAY_USE_TLS"}
# A client with this Ray's certificate connects first; the plain one gets three times as long (at least 10 s).
started = time.monotonic()
subprocess.run([sys.executable, "-c", sys.argv[2], gcs], capture_output=True, text=True, timeout=120, check=True)
patience = min(45.0, max(10.0, 3 * (time.monotonic() - started)))
try:
    plain = subprocess.run([sys.executable, "-c", sys.argv[2], gcs], env=plain_env, capture_output=True, text=True,
                           timeout=patience).stdout
except subprocess.TimeoutExpired as exc:
    plain = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
executor.close()
local = _release(keys, InProcessExecutor(), 29)
print("RESULT " + json.dumps({"equal": [a.tolist() for a in on_ray] == [a.tolist() for a in local],
                              "plain_connected": "CONNECTED" in plain, "gcs": gcs}))
"""

CLIENT = """
import sys, ray
ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", log_to_driver=False)
print("CONNECTED", len(ray.nodes()))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _host_ip() -> str:
    """The address Ray advertises for this host (2.60: used for the GCS even with --node-ip-address 127.0.0.1)."""
    from ray._private.services import get_node_ip_address

    return str(get_node_ip_address())


def _env(extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Token auth off, so what refuses the clients below is TLS alone.
    return {**base, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("raytls")
    ca = create_ca(tmp / "ca")
    names = ("localhost", "127.0.0.1", _host_ip())
    head = issue_ray_node_certificate(ca, tmp / "head", "ray-head", names)
    driver = issue_ray_node_certificate(ca, tmp / "driver", "computation-ray", names)
    other_ca = create_ca(tmp / "other-ca")
    stranger = issue_ray_node_certificate(other_ca, tmp / "stranger", "stranger", names)
    port = _free_port()
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    proc = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1",
         "--num-cpus", "2", "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(tmp / "ray")],
        env=_env(ray_tls_env(head)), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield {"address": f"127.0.0.1:{port}", "driver": driver, "stranger": stranger, "tmp": tmp}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(1)  # `ray start --block` often outlives SIGTERM by more than 30 s; the cluster is a temp dir
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ray_node_certificate_comes_from_the_ca_and_names_no_party_role(tmp_path: Path) -> None:
    from cryptography import x509

    ca = create_ca(tmp_path / "ca")
    files = issue_ray_node_certificate(ca, tmp_path / "n", "ray-worker", ("ray-worker", "10.231.7.3"))
    assert files == RayNodeFiles.in_directory(tmp_path / "n", "ray-worker")
    assert files.key_path.stat().st_mode & 0o077 == 0
    assert files.ca_cert_path.read_bytes() == ca.cert_pem()
    cert = x509.load_pem_x509_certificate(files.cert_path.read_bytes())
    cert.verify_directly_issued_by(ca.certificate())
    assert tls.identity_from_certificate(cert) is None  # not a party: cannot call the parties' services
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.231.7.3" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    assert ray_tls_env(files) == {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(files.cert_path),
                                  "RAY_TLS_SERVER_KEY": str(files.key_path), "RAY_TLS_CA_CERT": str(files.ca_cert_path)}


def test_a_release_through_the_tls_cluster_equals_in_process(cluster: dict) -> None:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", DRIVER, cluster["address"], str(cluster["tmp"])], cwd=ROOT,
                         env=_env(ray_tls_env(cluster["driver"])), capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["ray"] == result["inprocess"]
    assert any(any(v != 0 for v in m) for m in result["ray"])  # real values, not an empty release


def test_clients_without_the_deployments_tls_cannot_connect(cluster: dict) -> None:  # type: ignore[type-arg]
    # First show a client with the deployment's certificate connects (so the refusals below are about TLS), and how
    # long a client that can connect takes here: each refused client (plain, and one with another CA's certificate,
    # side by side) gets three times that (at least 10 s) to connect.
    started = time.monotonic()
    ok = subprocess.run([sys.executable, "-c", CLIENT, cluster["address"]], env=_env(ray_tls_env(cluster["driver"])),
                        capture_output=True, text=True, timeout=120)
    assert "CONNECTED" in ok.stdout, ok.stderr[-3000:]
    patience = min(45.0, max(10.0, 3 * (time.monotonic() - started)))
    envs = {"plain": _env({}), "other-ca": _env(ray_tls_env(cluster["stranger"]))}
    refused = {who: subprocess.Popen([sys.executable, "-c", CLIENT, cluster["address"]], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
               for who, env in envs.items()}
    deadline = time.monotonic() + patience
    for who, proc in refused.items():
        try:
            stdout, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            assert proc.returncode != 0, (who, stdout)
        except subprocess.TimeoutExpired:  # Ray keeps retrying a GCS it cannot handshake with
            proc.kill()
            stdout, _ = proc.communicate()
        assert "CONNECTED" not in stdout, who


def test_the_private_ray_the_server_starts_uses_tls(tmp_path: Path) -> None:
    ca = create_ca(tmp_path / "ca")
    node = issue_ray_node_certificate(ca, tmp_path / "node", "computation-ray", ("localhost", "127.0.0.1", _host_ip()))
    out = subprocess.run([sys.executable, "-c", PRIVATE, str(tmp_path), CLIENT], cwd=ROOT, env=_env(ray_tls_env(node)),
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["equal"] is True
    assert result["plain_connected"] is False, f"a plain client joined the private Ray at {result['gcs']}"


def test_apply_ray_tls_sets_the_environment_or_names_the_missing_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from he_partition.core.errors import InvalidInputError
    from parties.common.ray_tls import apply_ray_tls

    for k in ("RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT"):
        monkeypatch.setenv(k, "")  # recorded, so the environment apply_ray_tls sets is undone after the test
        monkeypatch.delenv(k)
    with pytest.raises(InvalidInputError, match="n1.crt does not exist"):
        apply_ray_tls(f"{tmp_path}:n1")
    assert "RAY_USE_TLS" not in os.environ
    files = issue_ray_node_certificate(create_ca(tmp_path / "ca"), tmp_path, "n1")
    assert apply_ray_tls(f"{tmp_path}:n1") == ray_tls_env(files)
    assert os.environ["RAY_USE_TLS"] == "1" and os.environ["RAY_TLS_SERVER_KEY"] == str(files.key_path)
    with pytest.raises(InvalidInputError, match="DIR:NODE_ID"):
        apply_ray_tls("n1")
