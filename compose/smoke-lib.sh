# Shared by compose/smoke.sh, compose/smoke-ray.sh and compose/smoke-threshold.sh (sourced, not run): step/ok/fail
# reporting, the ERR trap, `run_in`, `exit_code`, `wait_healthy`, and `cleanup` (the EXIT trap): logs on failure
# (plus `extra_failure_logs` if the script defines it), `down --volumes`, and a check that nothing of project
# $project is left. Needs $project and the array D.
step() { printf '\n== %s\n' "$*"; }
fail() { printf 'SMOKE FAILED: %s\n' "$*"; printf 'SMOKE FAILED: %s\n' "$*" >&2; exit 1; }
# A command that fails outside a check names itself (stdout: the pytest wrapper shows stdout's tail).
trap 'rc=$?; printf "SMOKE FAILED: exit %s at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND"' ERR
ok() { printf '   ok: %s\n' "$*"; }

cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    printf '\n== logs (failure)\n' >&2
    "${D[@]}" logs --no-color --tail 40 >&2 2>&1 || true
    if declare -F extra_failure_logs >/dev/null; then extra_failure_logs >&2 2>&1 || true; fi
  fi
  printf '\n== tear down\n'
  "${D[@]}" down --volumes --remove-orphans >/dev/null 2>&1 || true
  local left i
  for i in $(seq 60); do  # the daemon may still be removing containers when `down` returns
    [ -z "$(docker ps -aq --filter "label=com.docker.compose.project=$project")" ] && break
    sleep 1
  done
  left="$(docker ps -aq --filter "label=com.docker.compose.project=$project"
          docker volume ls -q --filter "label=com.docker.compose.project=$project"
          docker network ls -q --filter "label=com.docker.compose.project=$project")"
  [ -z "$left" ] || { echo "left behind: $left" >&2; rc=1; }
  [ "$rc" -eq 0 ] && echo "SMOKE PASSED" || echo "SMOKE FAILED (exit $rc)" >&2
  exit "$rc"
}


# `python -c "$probe" HOST PORT` in a container: exit 0 if it can open a TCP connection there, 3 if not.
probe='import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()
except OSError as e:
    print(f"cannot reach {sys.argv[1]}:{sys.argv[2]}: {e}"); sys.exit(3)
print(f"reached {sys.argv[1]}:{sys.argv[2]}")'

# $1 service, rest: command; runs it in a fresh container of that service (its volumes, networks, user).
run_in() { local svc=$1; shift; "${D[@]}" run --rm --no-deps -T --entrypoint "$1" "$svc" "${@:2}"; }
exit_code() { docker inspect --format '{{.State.ExitCode}}' "$("${D[@]}" ps -a -q "$1")"; }  # a job's exit code
# $1 service: poll its health check (after a start or restart) for up to 120 s; fail naming it if never healthy.
wait_healthy() {
  local id state i
  id="$("${D[@]}" ps -q "$1")"
  for i in $(seq 240); do
    state="$(docker inspect --format '{{.State.Health.Status}}' "$id" 2>/dev/null || echo gone)"
    [ "$state" = healthy ] && return 0
    sleep 0.5
  done
  fail "$1 is not healthy 120 s after its (re)start (state: $state)"
}
