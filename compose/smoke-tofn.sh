#!/usr/bin/env bash
# Live smoke test of a 2-of-3 key in the `threshold` profile (compose/threshold.yml with
# DPAGG_KEY_THRESHOLD=2, docs/threshold.md section 10): the key set up as any 2 of holder-1..3, the demo
# study released; a second study's owners upload with every holder up; holder-2 stopped, its release goes
# through with the other two; holder-3 stopped as well, the next release is refused naming both missing
# holders, and nothing more is charged.
#
#   compose/smoke-tofn.sh        # needs a Docker daemon and Compose v2 (2.24+), and python:3.11-slim
#
# Its own compose project (dpagg-tofn-smoke-<pid>-<random>, host port chosen free); removes its containers,
# volumes and networks on exit, pass or fail. Exits non-zero on the first failed check.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
project="${DPAGG_SMOKE_PROJECT:-dpagg-tofn-smoke-$$-$RANDOM}"
export DPAGG_PORT="${DPAGG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
export DPAGG_KEY_THRESHOLD=2
unset DPAGG_STUDY
D=(docker compose -f "$here/docker-compose.yml" -f "$here/threshold.yml" -p "$project" --profile demo
   --profile threshold)

# shellcheck source=compose/smoke-lib.sh
source "$here/smoke-lib.sh"

step "preflight"
docker info >/dev/null 2>&1 || fail "no Docker daemon reachable (docker info failed)"
"${D[@]}" config --quiet || fail "docker-compose.yml + threshold.yml do not validate"
trap cleanup EXIT
log_of() { "${D[@]}" logs --no-color --no-log-prefix "$1"; }

step "build: dpagg:local"
"${D[@]}" build pki
ok "image dpagg:local built"

step "up: 3 key-share holders, a 2-of-3 key, the demo study (3 owners, release, query)"
"${D[@]}" up -d
"${D[@]}" wait query >/dev/null || true
for svc in setup-key open-study owner-1 owner-2 owner-3 release query; do
  code="$(exit_code "$svc")"
  [ "$code" = 0 ] || { "${D[@]}" logs --no-color "$svc" >&2; fail "job $svc exited $code"; }
done
setup="$(log_of setup-key)"
echo "$setup" | sed 's/^/   /'
grep -q "^deployment [0-9a-f]\{64\} (fixed; holders holder-1, holder-2, holder-3; any 2 of 3 release;" \
  <<<"$setup" || fail "setup-key did not fix a 2-of-3 deployment"
ok "a 2-of-3 deployment (each study its own 2-of-3 key); the demo study released and queried"

step "study demo2: the owners upload with every holder up, then holder-2 stops"
DPAGG_STUDY=demo2 "${D[@]}" up -d owner-1 owner-2 owner-3
DPAGG_STUDY=demo2 "${D[@]}" wait owner-1 owner-2 owner-3 >/dev/null || fail "study demo2: an owner failed"
for _ in $(seq 60); do  # the uploads close and the owners' c1 parts reach the holders once all three committed
  log_of computation | grep -q "study demo2: c1 parts of 3 owners forwarded" && break
  sleep 1
done
log_of computation | grep -q "study demo2: c1 parts of 3 owners forwarded" || fail "study demo2's uploads never reached the holders"
"${D[@]}" stop holder-2
release=(run --rm --no-deps -T release dpagg release run demo2 --computation computation:50052 --state-dir /tmp/dpagg)
out="$("${D[@]}" "${release[@]}" --epsilon 0.5 --request-key demo2-one-down 2>&1)" || {
  echo "$out" >&2; fail "the release failed with one holder (holder-2) stopped"; }
q="$("${D[@]}" run --rm --no-deps -T query dpagg query latest --study demo2 --analyst computation:50052 \
     --range 0:20 --range 20:40 --range 40:65 --range 65:100)"
[ "$(grep -c '^bins \[' <<<"$q")" = 4 ] || { echo "$q" >&2; fail "no query answer for study demo2"; }
ok "released with holder-2 stopped: $(grep -m1 '^bins \[' <<<"$q")"

step "holder-3 stopped as well: refused before anything is charged, naming the missing holders"
"${D[@]}" stop holder-3
if failed="$("${D[@]}" "${release[@]}" --epsilon 0.3 --request-key demo2-two-down 2>&1)"; then
  echo "$failed" >&2; fail "a release went through with two of three holders stopped"
fi
echo "$failed" | tail -3 | sed 's/^/   /'
grep -q "needs 2 of 3" <<<"$failed" || fail "the refusal does not say the key needs 2 of 3 holders"
grep -q "holder-2" <<<"$failed" && grep -q "holder-3" <<<"$failed" || fail "the refusal does not name holder-2 and holder-3"
spent="$("${D[@]}" exec -T computation python -c 'import json, sys
log = json.load(open("/data/charges/demo2.json"))["log"]
print(len(log), sum(__import__("fractions").Fraction(c["entry"]["epsilon"]) for c in log))')"
echo "   study demo2's charge log at the computation server: $spent (entries, epsilon)"
[ "${spent%% *}" -ge 1 ] || fail "study demo2's charge log is empty"
python3 -c "import sys; from fractions import Fraction; assert abs(float(Fraction('${spent#* }')) - 0.5) < 1e-9" \
  || fail "study demo2 was charged more than its one release (0.5): $spent"
ok "refused naming holder-2 and holder-3; the log still holds only the first release's 0.5"

step "both holders back: the next release goes through"
"${D[@]}" start holder-2 holder-3
wait_healthy holder-2
wait_healthy holder-3
out="$("${D[@]}" "${release[@]}" --epsilon 0.3 --request-key demo2-back 2>&1)" || {
  echo "$out" >&2; fail "the release failed with every holder back"; }
ok "released again with every holder up"
