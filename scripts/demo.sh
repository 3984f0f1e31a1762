#!/usr/bin/env bash
# The main job, for now: set up, submit the sample jobs as two tenants, show the status.
# (Issue 4/6 turns this into `fsched demo`, with the daemon running them live.)
# Uses its own job table (.demo/fsched.db) unless FSCHED_DB is set.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
echo "== setting up ${FSCHED_VENV:-.venv} (first run: a few minutes)"
bash scripts/bootstrap.sh >"$log" 2>&1 || { cat "$log"; exit 1; }
rm -f "$log"
fsched="${FSCHED_VENV:-.venv}/bin/fsched"
export FSCHED_DB="${FSCHED_DB:-sqlite:///$PWD/.demo/fsched.db}"
echo "== job table: $FSCHED_DB"

"$fsched" tenants add alice --weight 3 2>/dev/null || "$fsched" tenants set-weight alice 3
"$fsched" tenants add bob --weight 1 2>/dev/null || "$fsched" tenants set-weight bob 1
"$fsched" submit sample_jobs/summaries.jsonl --tenant alice --class batch
"$fsched" submit sample_jobs/openai_batch.jsonl --tenant bob --class batch --priority 3
"$fsched" submit sample_jobs/chat.jsonl --tenant bob --class realtime
"$fsched" status
