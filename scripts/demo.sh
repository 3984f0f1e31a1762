#!/usr/bin/env bash
# The main job: set up, then `fsched demo` — a daemon on the built-in tiny model
# serving two tenants weighted 3:1 plus realtime chat, live, then a summary.
# Arguments go to `fsched demo` (e.g. --size 0.3 for a shorter run, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
echo "== setting up ${FSCHED_VENV:-.venv} (first run: a few minutes)"
bash scripts/bootstrap.sh >"$log" 2>&1 || { cat "$log"; exit 1; }
rm -f "$log"
exec "${FSCHED_VENV:-.venv}/bin/fsched" demo "$@"
