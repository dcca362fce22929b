#!/usr/bin/env bash
# Live smoke test of the `ray` profile (compose/ray.yml): the demo study with the computation server's
# chunk work on a TLS Ray cluster (a head and a worker container), then checks of the cluster's boundaries,
# the worker's health check and the limits and log rotation of the Ray containers.
#
#   compose/smoke-ray.sh        # needs a Docker daemon and Compose v2, and the base image python:3.11-slim
#
# Its own compose project (dpagg-ray-smoke-<pid>-<random>, host port chosen free); removes its containers,
# volumes and networks on exit, pass or fail. Exits non-zero on the first failed check.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
project="${DPAGG_SMOKE_PROJECT:-dpagg-ray-smoke-$$-$RANDOM}"
export DPAGG_PORT="${DPAGG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
unset DPAGG_STUDY
D=(docker compose -f "$here/docker-compose.yml" -f "$here/ray.yml" -p "$project" --profile demo --profile ray)

# shellcheck source=compose/smoke-lib.sh
source "$here/smoke-lib.sh"
extra_failure_logs() { "${D[@]}" exec -T ray-head sh -c 'tail -n 20 /tmp/ray/session_latest/logs/ray_client_server*.err'; }

step "preflight"
docker info >/dev/null 2>&1 || fail "no Docker daemon reachable (docker info failed)"
"${D[@]}" config --quiet || fail "docker-compose.yml + ray.yml do not validate"
trap cleanup EXIT

step "build: dpagg:local (pki) and dpagg-ray:local (the same Dockerfile with Ray)"
"${D[@]}" build pki
docker build -q -f "$here/Dockerfile" --build-arg DPAGG_RAY=ray==2.60.0 -t dpagg-ray:local "$here/.." >/dev/null
ok "images built"

step "up: key holder, Ray head + worker, the computation server as a TLS Ray client, the demo study"
"${D[@]}" up -d
"${D[@]}" wait query >/dev/null || true
for svc in pki ray-pki sample-data open-study owner-1 owner-2 owner-3 release query; do
  code="$(docker inspect --format '{{.State.ExitCode}}' "$("${D[@]}" ps -a -q "$svc")")"
  [ "$code" = 0 ] || { "${D[@]}" logs --no-color "$svc" >&2; fail "job $svc exited $code"; }
done
ok "every job exited 0"
out="$("${D[@]}" logs --no-color --no-log-prefix query)"
[ "$(grep -c '^bins \[' <<<"$out")" = 4 ] || { echo "$out" >&2; fail "the query did not print 4 ranges"; }
ok "analyst query: $(grep -m1 '^bins \[' <<<"$out")"

step "the worker's health check, limits and log rotation"
[ "$(docker inspect --format '{{.State.Health.Status}}' "$("${D[@]}" ps -q ray-worker)")" = healthy ] \
  || fail "ray-worker is not healthy"
ok "ray-worker healthy (registered with the head as alive)"
check_limits ray-head ray-worker computation

step "the release ran on the cluster"
nodes='import ray
from ray._private.state import actors
ray.init(address="10.231.7.2:6379", _node_ip_address="10.231.7.2", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]
chunk = [a for a in actors().values() if "ChunkWorker" in a["ActorClassName"] and a["State"] == "ALIVE"]
on_nodes = {a["Address"]["NodeID"] for a in chunk}
print(f"nodes={len(alive)} chunk_actors={len(chunk)} on_nodes={len(on_nodes)}")'
got="$("${D[@]}" exec -T ray-head python -c "$nodes" | tail -1)" || true
echo "   $got"
case "$got" in
  "nodes=2 chunk_actors=2 on_nodes=2") ok "2 Ray nodes, one of the computation server's chunk actors on each" ;;
  *) fail "expected 2 Ray nodes with chunk actors, got: ${got:-nothing}" ;;
esac

step "a client without the deployment's TLS cannot join"
plain='import ray
ray.init(address="10.231.7.2:6379", _node_ip_address="10.231.7.3", log_to_driver=False)
print("CONNECTED", len(ray.nodes()))'
if "${D[@]}" exec -T -e RAY_USE_TLS=0 ray-worker timeout 60 python -c "$plain" 2>/dev/null | grep -q CONNECTED; then
  fail "a plain (non-TLS) Ray client joined the cluster"
fi
ok "plain Ray client refused by the head (no TLS)"
if "${D[@]}" exec -T ray-head python -c "$probe" decryption 50051 >/dev/null 2>&1; then
  fail "a Ray node reaches the decryption server"
fi
ok "ray-head cannot reach decryption:50051"
