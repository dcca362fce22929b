#!/usr/bin/env bash
# Regenerate compose/requirements.lock: the exact runtime dependency versions the image installs.
# Run from anywhere; it installs the project (without extras) into a throwaway venv and freezes it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$root"
{
  echo "# Pinned runtime dependencies of the dpagg image (pip install -r; regenerate with compose/lock.sh)."
  "$venv/bin/pip" freeze | grep -v '^dpagg'
} > "$root/compose/requirements.lock"
echo "wrote $root/compose/requirements.lock"
