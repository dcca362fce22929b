#!/usr/bin/env bash
# Boots every compose deployment for real, one after the other: smoke.sh (single key holder),
# smoke-threshold.sh (3 key-share holders), smoke-tofn.sh (2-of-3) and smoke-ray.sh (the CS's workers on
# Ray). .ci/run calls it after the tests. Where Docker is installed but its daemon is not running, it starts
# the daemon (and stops it again at the end); where Docker, Compose v2 or the base image cannot be had, it
# prints "SMOKES SKIPPED: <reason>" and exits 0, so a machine without Docker still runs the rest of CI.
# Any smoke that fails makes it exit 1 with that smoke's output. DPAGG_SMOKES=skip skips them on purpose.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
SMOKES=(smoke.sh smoke-threshold.sh smoke-tofn.sh smoke-ray.sh)
skip() { printf 'SMOKES SKIPPED: %s\n' "$*"; exit 0; }
started_pid=""

stop_daemon() {
  [ -n "$started_pid" ] || return 0
  echo "stopping the dockerd this script started (pid $started_pid)"
  kill "$started_pid" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$started_pid" 2>/dev/null || break; sleep 1; done
}
[ "${DPAGG_SMOKES:-}" = "skip" ] && skip "DPAGG_SMOKES=skip"
command -v docker >/dev/null 2>&1 || skip "Docker is not installed (no docker command on PATH)"
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null 2>&1 || skip "no Docker daemon reachable and no dockerd here to start one"
  [ "$(id -u)" = 0 ] || skip "no Docker daemon reachable, and starting dockerd needs root"
  log="${TMPDIR:-/tmp}/dpagg-smokes-dockerd.log"
  echo "starting dockerd for the smokes (log $log)"
  rm -f /var/run/docker.pid  # a stale pid file makes dockerd refuse to start
  (cd / && setsid nohup dockerd >>"$log" 2>&1 </dev/null &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  started_pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
  docker info >/dev/null 2>&1 || { stop_daemon; skip "dockerd did not answer within 60 s (see $log)"; }
fi
trap stop_daemon EXIT

v="$(docker compose version --short 2>/dev/null || true)"
[[ "${v#v}" == 2.* ]] || skip "Compose v2 is not installed (docker compose version: ${v:-none}); compose/README.md says how"
why="$(bash "$here/base-image.sh")" || skip "${why##*$'\n'}"

failed=()
for s in "${SMOKES[@]}"; do
  echo "== compose/$s"
  start=$SECONDS
  out="$(bash "$here/$s" 2>&1)"; rc=$?
  if [ "$rc" -eq 0 ] && grep -q '^SMOKE PASSED' <<<"$out"; then
    echo "   passed in $((SECONDS - start)) s"
  else
    echo "$out" | tail -60
    echo "   FAILED (exit $rc) after $((SECONDS - start)) s"
    failed+=("$s")
  fi
done
[ "${#failed[@]}" -eq 0 ] || { echo "SMOKES FAILED: ${failed[*]}"; exit 1; }
echo "SMOKES PASSED: ${SMOKES[*]}"
