#!/usr/bin/env bash
# Live smoke test of the `threshold` profile (compose/threshold.yml): three key-share holders, each in its
# own container, volume and network; key setup through the computation server; the demo study released
# through all three; every holder's ledger charged alike; a holder stopped stops the next release before
# anything is decrypted, and once restarted the release goes through; holders reach nobody but the CS; each
# holder's ledger is backed up on a schedule into its own backup volume; limits and log rotation applied.
#
#   compose/smoke-threshold.sh        # needs a Docker daemon and Compose v2 (2.24+), and python:3.11-slim
#
# Its own compose project (dpagg-threshold-smoke-<pid>-<random>, host port chosen free); removes its
# containers, volumes and networks on exit, pass or fail. Exits non-zero on the first failed check.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
project="${DPAGG_SMOKE_PROJECT:-dpagg-threshold-smoke-$$-$RANDOM}"
export DPAGG_PORT="${DPAGG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
unset DPAGG_STUDY
export DPAGG_BACKUP_INTERVAL=5  # holder-N-ledger-backup copies every 5 s here (default: hourly)
D=(docker compose -f "$here/docker-compose.yml" -f "$here/threshold.yml" -p "$project" --profile demo
   --profile threshold)
HOLDERS=(holder-1 holder-2 holder-3)

# shellcheck source=compose/smoke-lib.sh
source "$here/smoke-lib.sh"

step "preflight"
docker info >/dev/null 2>&1 || fail "no Docker daemon reachable (docker info failed)"
"${D[@]}" config --quiet || fail "docker-compose.yml + threshold.yml do not validate"
trap cleanup EXIT

log_of() { "${D[@]}" logs --no-color --no-log-prefix "$1"; }  # read whole, then grep (see smoke.sh)
extra_failure_logs() {  # on failure: every server's errors with their tracebacks (the tail above is the backups')
  for svc in computation "${HOLDERS[@]}"; do
    printf '\n-- %s: errors\n' "$svc"
    "${D[@]}" logs --no-color --no-log-prefix "$svc" 2>&1 | grep -A25 -E 'ERROR|Traceback' | tail -60
  done
}
# `dpagg budget STUDY` across the three holders, asked by the computation server (the only party on
# their networks; role computation may read a budget). Extra arguments go to the command.
budget() {
  local study=$1; shift
  "${D[@]}" exec -T computation dpagg budget "$study" --decryption holder-1=holder-1:50051 \
    --decryption holder-2=holder-2:50051 --decryption holder-3=holder-3:50051 "$@"
}

step "build: dpagg:local"
"${D[@]}" build pki
ok "image dpagg:local built"

step "up: 3 key-share holders, the computation server, key setup, the demo study (3 owners, release, query)"
"${D[@]}" up -d
"${D[@]}" wait query >/dev/null || true
for svc in pki holder-pki sample-data owner-1-keygen owner-2-keygen owner-3-keygen setup-key open-study \
           owner-1 owner-2 owner-3 release query; do
  code="$(exit_code "$svc")"
  [ "$code" = 0 ] || { "${D[@]}" logs --no-color "$svc" >&2; fail "job $svc exited $code"; }
done
ok "every job exited 0"
[ -z "$("${D[@]}" ps -a -q decryption 2>/dev/null)" ] || fail "the single-key decryption server runs in this profile"
ok "no single-key decryption server"

step "setup-key fixed the deployment; the study got its own key at open-study"
setup="$(log_of setup-key)"
echo "$setup" | sed 's/^/   /'
digest="$(sed -n 's/^deployment \([0-9a-f]\{64\}\) (fixed; holders holder-1, holder-2, holder-3; all 3 of 3 release;.*$/\1/p' \
  <<<"$setup")"
[ -n "$digest" ] || fail "setup-key printed no deployment digest for holder-1..3"
ok "deployment digest $digest"
again="$("${D[@]}" run --rm --no-deps -T setup-key 2>&1)" || { echo "$again" >&2; fail "a second setup-key failed"; }
grep -q "^deployment $digest (already fixed;" <<<"$again" || { echo "$again" >&2
  fail "a second setup-key did not report the same deployment $digest as already fixed"; }
ok "a second setup-key reports the same deployment, already fixed (not replaced)"

step "the demo study released through the three holders; the analyst's query answered"
out="$(log_of query)"
[ "$(grep -c '^bins \[' <<<"$out")" = 4 ] || { echo "$out" >&2; fail "the query did not print 4 ranges"; }
ok "analyst query: $(grep -m1 '^bins \[' <<<"$out")"

step "every holder's ledger was charged, and the three views agree"
view="$(budget demo --verify)" || { echo "$view" >&2; fail "dpagg budget across the 3 holders failed or disagrees"; }
echo "$view" | grep -v '^  #' | sed 's/^/   /'
grep -q "all 3 holders agree" <<<"$view" || fail "the holders' views do not agree"
for h in "${HOLDERS[@]}"; do
  grep -q "^holder $h (.*): spent 1 of 1," <<<"$view" || fail "$h's ledger was not charged the study's budget"
done
ok "holder-1..3 each spent 1 of 1 on study demo"
for h in "${HOLDERS[@]}"; do  # the study ended (its budget spent): its key shares are gone, its ledger stays
  "${D[@]}" exec -T "$h" sh -c '! test -e /data/keys/studies/demo' || fail "$h still keeps study demo's key share"
done
ok "holder-1..3 erased study demo's key share once its budget was spent"

step "limits, log rotation and each holder's scheduled ledger backup"
check_limits computation "${HOLDERS[@]}" holder-1-ledger-backup
for h in "${HOLDERS[@]}"; do
  wait_healthy "$h-ledger-backup"
  b="$(scheduled_backup_with "$h-ledger-backup" "study demo: [0-9]* charge(s), 1 of 1 spent")"
  "${D[@]}" exec -T "$h" sh -c '! ls /data | grep -qi backup' || fail "a backup sits on $h's data volume"
  if "${D[@]}" exec -T "$h-ledger-backup" sh -c 'touch /data/x' 2>/dev/null; then fail "$h-ledger-backup can write $h's volume"; fi
  ok "$h: scheduled backup $b ($h-ledger-backups) verifies with study demo spent; $h's volume read-only to it"
done

step "network separation: holders reach only the computation server"
for h in "${HOLDERS[@]}"; do
  "${D[@]}" exec -T computation python -c "$probe" "$h" 50051 >/dev/null || fail "computation cannot reach $h"
  for other in "${HOLDERS[@]}"; do
    [ "$other" = "$h" ] && continue
    if "${D[@]}" exec -T "$h" python -c "$probe" "$other" 50051 >/dev/null 2>&1; then fail "$h reaches $other"; fi
  done
  if "${D[@]}" exec -T "$h" python -c "$probe" 1.1.1.1 443 >/dev/null 2>&1; then fail "$h reaches the internet"; fi
  ok "$h: reached by computation; reaches no other holder and not 1.1.1.1:443"
done
for svc in owner-1 release query; do
  for h in "${HOLDERS[@]}"; do
    if run_in "$svc" python -c "$probe" "$h" 50051 >/dev/null 2>&1; then fail "$svc reaches $h"; fi
  done
  ok "$svc reaches no holder"
done
keys='import os
for top in ("/ca", "/pki", "/data"):
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            if f.endswith(".key") and os.access(p, os.R_OK):
                print(p)'
for h in "${HOLDERS[@]}"; do
  got="$("${D[@]}" exec -T "$h" python -c "$keys" | sort | xargs)"
  [ "$got" = "/pki/$h.key" ] || fail "$h can read TLS keys [$got], expected only /pki/$h.key"
  ok "$h reads only its own TLS key"
done

step "a holder down: the next release fails before anything is decrypted"
DPAGG_STUDY=demo2 "${D[@]}" up -d owner-1 owner-2 owner-3
DPAGG_STUDY=demo2 "${D[@]}" wait owner-1 owner-2 owner-3 >/dev/null || fail "study demo2: an owner failed"
"${D[@]}" stop holder-2
release2=(run --rm --no-deps -T release dpagg release run demo2 --epsilon 0.5 --computation computation:50052
          --state-dir /tmp/dpagg)
if failed="$("${D[@]}" "${release2[@]}" --request-key demo2-down 2>&1)"; then
  echo "$failed" >&2; fail "a release went through with holder-2 stopped"
fi
echo "$failed" | tail -3 | sed 's/^/   /'
grep -q "holder-2" <<<"$failed" || fail "the failed release does not name holder-2"
if q="$("${D[@]}" run --rm --no-deps -T query dpagg query latest --study demo2 --analyst computation:50052 \
        --range 0:100 2>&1)" && grep -q '^bins \[' <<<"$q"; then
  echo "$q" >&2; fail "study demo2 has a release although holder-2 was down"
fi
ok "release refused naming holder-2; study demo2 has no released values"

step "the holder back: the release goes through"
"${D[@]}" start holder-2
wait_healthy holder-2
ok_out="$("${D[@]}" "${release2[@]}" --request-key demo2-up 2>&1)" || { echo "$ok_out" >&2; fail "the release failed after holder-2 restarted"; }
q="$("${D[@]}" run --rm --no-deps -T query dpagg query latest --study demo2 --analyst computation:50052 \
     --range 0:20 --range 20:40 --range 40:65 --range 65:100)"
[ "$(grep -c '^bins \[' <<<"$q")" = 4 ] || { echo "$q" >&2; fail "no query answer for study demo2"; }
ok "study demo2 released after the restart: $(grep -m1 '^bins \[' <<<"$q")"
view="$(budget demo2 || true)"
echo "$view" | grep -v '^  #' | sed 's/^/   /'
for h in "${HOLDERS[@]}"; do
  grep -q "^holder $h (.*): spent 0.5 of 1," <<<"$view" || fail "$h was not charged exactly the one release"
done
grep -q "all 3 holders agree" <<<"$view" || fail "the holders' views of study demo2 disagree"
ok "each holder charged 0.5 once (the refused release charged nobody); holder-2's share and ledger survived"

step "a join study at the three holders: its keys set up at open-join, pseudonyms from the holders, planes checked by them"
DJ=("${D[@]}" --profile join)
opened="$("${D[@]}" run --rm --no-deps -T open-study dpagg open-join --computation computation:50052 \
  --study-id join --owners owner-1,owner-2 --rows age:0:100:4 --cols age:0:100:3 --max-records 1000,1000 \
  --epsilon 3 --padding-epsilon 0.5 --release cells --owner-keys-dir /owner-keys \
  --approval-key /operator/operator.approval.key 2>&1)" || { echo "$opened" >&2; fail "open-join at the holders failed"; }
grep -q "^join study join opened" <<<"$opened" || { echo "$opened" >&2; fail "open-join did not open study join"; }
ok "$(head -1 <<<"$opened")"
"${DJ[@]}" run --rm --no-deps -T join-owner-1 >/tmp/dpagg-join-owner-1.$$ 2>&1 & pid1=$!
"${DJ[@]}" run --rm --no-deps -T join-owner-2 >/tmp/dpagg-join-owner-2.$$ 2>&1 & pid2=$!
for o in 1 2; do
  pid="pid$o"
  if ! wait "${!pid}"; then cat "/tmp/dpagg-join-owner-$o.$$" >&2; fail "join-owner-$o failed"; fi
  grep -q "^owner-$o submitted .* records to join study join" "/tmp/dpagg-join-owner-$o.$$" || {
    cat "/tmp/dpagg-join-owner-$o.$$" >&2; fail "join-owner-$o did not submit"; }
  ok "$(grep "^owner-$o submitted" "/tmp/dpagg-join-owner-$o.$$")"
  rm -f "/tmp/dpagg-join-owner-$o.$$"
done
joined="$("${D[@]}" run --rm --no-deps -T release dpagg release run join --epsilon 2.5 --computation computation:50052 \
  --state-dir /tmp/dpagg --request-key join-1 2>&1)" || { echo "$joined" >&2; fail "the join's release failed"; }
echo "$joined" | tail -3 | sed 's/^/   /'
q="$("${D[@]}" run --rm --no-deps -T query dpagg query latest --study join --analyst computation:50052 \
     --range 0:3 --range 3:6 --range 6:9 --range 9:12)"
[ "$(grep -c '^bins \[' <<<"$q")" = 4 ] || { echo "$q" >&2; fail "no query answer for the join's table"; }
ok "the join's table released through the holders: $(grep -m1 '^bins \[' <<<"$q")"
view="$(budget join || true)"
echo "$view" | grep -v '^  #' | sed 's/^/   /'
for h in "${HOLDERS[@]}"; do
  grep -q "^holder $h (.*): spent 3 of 3," <<<"$view" || fail "$h was not charged the padding and the release"
  "${D[@]}" exec -T "$h" sh -c '! test -e /data/keys/studies/join && ! test -e /data/join_planes/join' ||
    fail "$h still keeps study join's key share or the owners' planes"
done
ok "each holder charged the padding (0.5) and the release (2.5); the budget spent, each erased its key share and the planes"
