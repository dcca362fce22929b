#!/usr/bin/env bash
# Live smoke test of the compose deployment: build, boot, run a whole study, check the trust
# boundaries, the limits, log rotation and the scheduled ledger backup (into its own volume), restart
# the key holder, restore its ledger from a scheduled backup, `down` then `up` again, a second study,
# tear down.
#
#   compose/smoke.sh            # from anywhere; needs a Docker daemon and Compose v2
#
# Runs as its own compose project (dpagg-smoke-<pid>-<random>, host port chosen free) so it never touches a
# deployment named dpagg, and removes its containers, volumes and networks on exit, pass or
# fail. Exits non-zero on the first failed check. Without registry access it needs a local
# image named python:3.11-slim (compose/README.md, "Offline base image").
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
project="${DPAGG_SMOKE_PROJECT:-dpagg-smoke-$$-$RANDOM}"  # unique: nothing left by another run can collide
export DPAGG_PORT="${DPAGG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
unset DPAGG_STUDY
export DPAGG_BACKUP_INTERVAL=5  # the ledger-backup sidecar copies every 5 s here (default: hourly)
C=(docker compose -f "$here/docker-compose.yml" -p "$project")
D=("${C[@]}" --profile demo)

# shellcheck source=compose/smoke-lib.sh
source "$here/smoke-lib.sh"

step "preflight"
docker info >/dev/null 2>&1 || fail "no Docker daemon reachable (docker info failed)"
version="$(docker compose version --short 2>/dev/null || true)"
case "$version" in
  2.*|v2.*) ok "Docker $(docker version --format '{{.Server.Version}}'), Compose $version" ;;
  *) fail "Compose v2 is required (\`docker compose version\` said: ${version:-nothing}); see compose/README.md" ;;
esac
"${C[@]}" config --quiet || fail "docker-compose.yml does not validate"
trap cleanup EXIT

check_jobs() {  # every one-shot job of the demo profile exited 0
  local svc
  for svc in pki operator-keygen sample-data owner-1-keygen owner-2-keygen owner-3-keygen open-study owner-1 owner-2 owner-3 release query; do
    [ "$(exit_code "$svc")" = 0 ] || { "${D[@]}" logs --no-color "$svc" >&2; fail "job $svc exited $(exit_code "$svc")"; }
  done
  ok "every job exited 0"
}

query_output() { "${D[@]}" logs --no-color --no-log-prefix query; }
# A service's whole log, read before any search: `logs | grep -q` under pipefail fails by chance
# (grep exits at its match, the logs command dies of SIGPIPE writing the next line; measured:
# 5 in 100 with the match one line from the end).
log_of() { "${D[@]}" logs --no-color "$1"; }

check_query() {  # the analyst query printed four ranges of the newest release of study $1
  local out
  out="$(query_output)"
  [ "$(grep -c '^bins \[' <<<"$out")" = 4 ] || { echo "$out" >&2; fail "query of study $1 did not print 4 ranges"; }
  grep -q "of study $1" <<<"$out" || { echo "$out" >&2; fail "query did not read study $1"; }
  ok "analyst query of study $1: $(grep -m1 '^bins \[' <<<"$out")"
}

step "build (one image, built by the pki service)"
"${D[@]}" build
ok "image dpagg:local built"

step "up: servers, then the demo study (3 owners, release, query)"
"${D[@]}" up -d
"${D[@]}" wait query >/dev/null || true
check_jobs
check_query demo
release1="$(sed -n 's/^release \(rel-[0-9a-f]*\) of study demo.*/\1/p' <<<"$(query_output)")"
release1="${release1%%$'\n'*}"  # the first, should there be several
[ -n "$release1" ] || fail "no release id in the query output"

step "limits, log rotation and the scheduled ledger backup"
check_limits decryption computation ledger-backup
wait_healthy ledger-backup
backup="$(scheduled_backup_with ledger-backup "study demo: 2 charge(s), 1 of 1 spent")"
ok "scheduled backup $backup (ledger-backups volume) verifies and holds study demo's charges"
listing="$("${D[@]}" exec -T ledger-backup ls -A /backups)"
! grep -qvE '^(ledger-|\.partial-)[0-9TZ]+\.sqlite3$' <<<"$listing" || fail "ledger-backups holds more than ledger backups: $listing"
if "${D[@]}" exec -T ledger-backup sh -c 'touch /data/x' 2>/dev/null; then fail "ledger-backup can write the key holder's volume"; fi
if "${D[@]}" exec -T ledger-backup python -c "$probe" decryption 50051 >/dev/null 2>&1; then fail "ledger-backup has a network"; fi
"${D[@]}" exec -T decryption sh -c '! ls /data | grep -qi backup' || fail "a backup sits on the key holder's volume"
ok "ledger-backup: key holder's volume read-only, no network; no backup on decryption-data"

step "network separation"
"${D[@]}" exec -T computation python -c "$probe" decryption 50051 >/dev/null || fail "computation cannot reach decryption"
ok "computation -> decryption:50051 reachable"
for svc in owner-1 query release; do
  run_in "$svc" python -c "$probe" computation 50052 >/dev/null || fail "$svc cannot reach computation"
  if run_in "$svc" python -c "$probe" decryption 50051 >/dev/null 2>&1; then fail "$svc reaches the decryption server"; fi
  ok "$svc -> computation:50052 reachable, decryption:50051 not"
done

step "each party reads only its own keys"
keys='import os
for top in ("/ca", "/pki", "/owner", "/owner-keys", "/data", "/samples", "/backups", "/operator", "/operator-public"):
    for d, _, files in os.walk(top):
        if "/state/" in d + "/":  # upload idempotency keys, not secrets
            continue
        for f in files:
            p = os.path.join(d, f)
            if (f.endswith(".key") or f == "secret_context.bin") and os.access(p, os.R_OK):
                print(p)'
expect_keys() {  # $1 service, $2 how to run (exec|run), $3 expected readable secret files, space-separated
  local got
  if [ "$2" = exec ]; then got="$("${D[@]}" exec -T "$1" python -c "$keys" | sort | xargs)";
  else got="$(run_in "$1" python -c "$keys" | sort | xargs)"; fi
  [ "$got" = "$3" ] || fail "$1 can read [$got], expected [$3]"
  ok "$1 reads only: $got"
}
expect_keys decryption exec "/data/keys/secret_context.bin /pki/decryption.key"
# The key holder's own sidecar, on its host: it mounts the key holder's volume read-only (no network) and
# writes only ledger copies (no key material) to ledger-backups.
expect_keys ledger-backup exec "/data/keys/secret_context.bin"
expect_keys computation exec "/pki/computation.key"
for n in 1 2 3; do expect_keys "owner-$n" run "/owner/owner-$n.signing.key /pki/owner-$n.key"; done
expect_keys open-study run "/operator/operator.approval.key /pki/operator.key"
expect_keys release run "/pki/operator.key"
expect_keys query run "/pki/analyst.key"

step "restart the decryption server: the ledger survives"
"${D[@]}" exec -T ledger-backup dpagg ledger backup --data-dir /data --out /backups/before.sqlite3 >/dev/null
before="$("${D[@]}" exec -T ledger-backup dpagg ledger verify /backups/before.sqlite3 | grep '^study')"
"${D[@]}" restart decryption
wait_healthy decryption
wait_healthy computation
"${D[@]}" exec -T ledger-backup dpagg ledger backup --data-dir /data --out /backups/after.sqlite3 >/dev/null
after="$("${D[@]}" exec -T ledger-backup dpagg ledger verify /backups/after.sqlite3 | grep '^study')"
[ "$before" = "$after" ] || fail "ledger changed across a restart: [$before] vs [$after]"
grep -q "study demo: 2 charge(s), 1 of 1 spent" <<<"$after" || fail "unexpected ledger: $after"
grep -q "ledger hash chain verified: 2 charge rows" <<<"$(log_of decryption)" || fail "no chain check logged"
ok "ledger before and after: $after"

step "restore the ledger from a scheduled backup (as compose/README.md says)"
"${D[@]}" stop ledger-backup decryption >/dev/null
restored="$("${D[@]}" run --rm --no-deps -T -v "${project}_ledger-backups:/backups" decryption \
  dpagg ledger restore "$backup" --data-dir /data --acknowledge-rollback)" || fail "ledger restore failed"
grep -q "^ledger restored from $backup" <<<"$restored" || fail "restore said: $restored"
"${D[@]}" start decryption ledger-backup >/dev/null
wait_healthy decryption
wait_healthy computation
wait_healthy ledger-backup
scheduled_backup_with ledger-backup "study demo: 2 charge(s), 1 of 1 spent" >/dev/null
ok "restored from $backup with the server stopped; served again, next scheduled backup the same"

step "down, then up again (volumes kept): every job comes back"
"${D[@]}" down
"${D[@]}" up -d
"${D[@]}" wait query >/dev/null || true
check_jobs
check_query demo
grep -q "$release1" <<<"$(query_output)" || fail "after up the query did not read the first release $release1"
grep -q "had already submitted" <<<"$(log_of owner-1)" || fail "owner-1 did not recognise its upload"
ok "same release $release1, nothing submitted or spent twice"

step "rotate the computation server's certificate"
fingerprint='import hashlib; print(hashlib.sha256(open("/pki/computation.crt", "rb").read()).hexdigest()[:16])'
old_cert="$("${D[@]}" exec -T computation python -c "$fingerprint")"
"${D[@]}" run --rm --no-deps -T pki dpagg certs --ca /ca --out /pki --per-party-dirs --force \
  --party computation:computation >/dev/null
"${D[@]}" restart computation
wait_healthy computation
new_cert="$("${D[@]}" exec -T computation python -c "$fingerprint")"
[ "$old_cert" != "$new_cert" ] || fail "the computation server still presents certificate $old_cert"
"${D[@]}" up -d --no-deps --force-recreate query
"${D[@]}" wait query >/dev/null || true
[ "$(exit_code query)" = 0 ] || fail "the analyst cannot query after the rotation"
ok "certificate $old_cert replaced by $new_cert; the analyst still connects"

step "a second study on the same deployment"
DPAGG_STUDY=demo2 "${D[@]}" up -d
DPAGG_STUDY=demo2 "${D[@]}" wait query >/dev/null || true
check_jobs
check_query demo2
"${D[@]}" exec -T ledger-backup dpagg ledger backup --data-dir /data --out /backups/second.sqlite3 >/dev/null
ledger="$("${D[@]}" exec -T ledger-backup dpagg ledger verify /backups/second.sqlite3)"
grep -q "study demo2: 2 charge(s), 1 of 1 spent" <<<"$ledger" || fail "study demo2 not in the ledger: $ledger"
grep -q "study demo: 2 charge(s), 1 of 1 spent" <<<"$ledger" || fail "study demo changed: $ledger"
ok "study demo2 released; study demo untouched"
