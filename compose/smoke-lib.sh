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

# $@ services: each running container has memory, CPU and process-count limits and rotated json-file logs
# (what compose applied, read back from Docker: `docker inspect`).
check_limits() {
  local svc got
  for svc in "$@"; do
    got="$(docker inspect --format \
      '{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.PidsLimit}} {{.HostConfig.LogConfig.Type}} {{index .HostConfig.LogConfig.Config "max-size"}} {{index .HostConfig.LogConfig.Config "max-file"}}' \
      "$("${D[@]}" ps -q "$svc")")"
    read -r mem cpu pids log size files <<<"$got"
    [ "${mem:-0}" -gt 0 ] && [ "${cpu:-0}" -gt 0 ] && [ "${pids:-0}" -gt 0 ] \
      || fail "$svc runs without a memory, CPU or process-count limit (memory $mem, nano-CPUs $cpu, pids $pids)"
    [ "$log" = json-file ] && [ -n "$size" ] && [ "$size" != "<no value>" ] && [ -n "$files" ] \
      && [ "$files" != "<no value>" ] || fail "$svc logs are not rotated (driver $log, max-size $size, max-file $files)"
    ok "$svc: memory $((mem / 1048576)) MiB, $(awk "BEGIN { print $cpu / 1e9 }") CPUs, $pids processes; logs $log $size x $files"
  done
}

# $1 backup service, $2 text the ledger's `verify` must print: wait (60 s at most) for a scheduled backup in its
# /backups that verifies and shows it; prints that backup's name.
scheduled_backup_with() {
  local svc=$1 want=$2 i newest out
  for i in $(seq 30); do
    newest="$("${D[@]}" exec -T "$svc" sh -c 'ls -1 /backups/ledger-*.sqlite3 2>/dev/null | tail -n 1')"
    if [ -n "$newest" ] && out="$("${D[@]}" exec -T "$svc" dpagg ledger verify "$newest" 2>&1)" \
        && grep -q "$want" <<<"$out"; then
      echo "$newest"; return 0
    fi
    sleep 2
  done
  fail "$svc wrote no verified backup showing [$want] in 60 s (newest: ${newest:-none}; ${out:-})"
}
