#!/usr/bin/env bash
# fsched's built-in engine on one CUDA device, in at most 8 minutes.
#
# For a machine whose image already has torch and transformers (and no vLLM):
# fsched is installed beside them without dependencies, in a virtual
# environment that sees the system packages, so nothing re-downloads torch.
# What it prints (docs/vllm.md explains each figure):
#   1. versions: torch, CUDA, transformers, the GPU;
#   2. bench/engine.py on a ~0.5B random Llama in bf16 (64 requests, prompts
#      16-128, outputs 8-128, greedy): generate-1 / static-B / fsched tok/s,
#      and mismatches against one-at-a-time generate (must be 0);
#   3. the same on the tiny model with batch 64 and 128 requests;
#   4. `fsched daemon --device cuda` serving a 64-request job from SQLite
#      (--until-idle): wall seconds and tokens/s from submit to results.
# Each step has its own time limit; a step that fails is reported and the next runs.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv="${FSCHED_GPU_VENV:-.venv-gpu}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-deps -e . || exit 1
  "$venv/bin/python" -m pip install -q "typer>=0.12" "rich>=13" "sqlalchemy>=2.0" || exit 1
fi
py="$venv/bin/python"
step() {  # step SECONDS TITLE COMMAND...
  local limit=$1 title=$2; shift 2
  echo; echo "== $title (limit ${limit}s)"
  timeout "$limit" "$@" || echo "!! $title: exit $? (see above)"
}
step 30 "versions" "$py" -c "
import torch, transformers
print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| transformers', transformers.__version__)
assert torch.cuda.is_available(), 'no CUDA device'
p = torch.cuda.get_device_properties(0)
print('GPU', p.name, f'{p.total_memory / 2**30:.0f} GiB')"
step 210 "engine, ~0.5B random Llama, bf16" "$py" bench/engine.py --device cuda --gpu-model --skip hf-cb
step 120 "engine, tiny model, batch 64" "$py" bench/engine.py --device cuda --requests 128 --max-batch 64 \
  --skip hf-cb --static 32,64
daemon_run() {
  local tmp; tmp=$(mktemp -d)
  export FSCHED_DB="sqlite:///$tmp/fsched.db"
  "$py" - "$tmp/job.jsonl" <<'PY'
import json, random, sys
rng = random.Random(0)
words = "the fair queue serves every tenant its share of tokens while realtime chat waits".split()
with open(sys.argv[1], "w") as f:
    for i in range(64):
        f.write(json.dumps({"custom_id": f"r{i}", "prompt": " ".join(rng.choices(words, k=rng.randint(8, 60))),
                            "max_tokens": rng.randint(8, 128), "temperature": 0}) + "\n")
PY
  local t0; t0=$(date +%s.%N)
  "$venv/bin/fsched" submit "$tmp/job.jsonl" >/dev/null && "$venv/bin/fsched" daemon --device cuda --until-idle --quiet
  local t1; t1=$(date +%s.%N)
  "$py" -c "
import sqlite3, sys
n, tokens = sqlite3.connect('$tmp/fsched.db').execute(\"SELECT COUNT(*), SUM(num_output_tokens) FROM requests WHERE state = 'done'\").fetchone()
wall = $t1 - $t0
print(f'daemon: {n} requests done, {tokens} tokens in {wall:.1f} s (model load included): {tokens / wall:.0f} tok/s')"
}
step 120 "fsched daemon --device cuda, 64 requests from SQLite" bash -c "$(declare -f daemon_run); py=$py venv=$venv daemon_run"
echo; echo "== total $(( $(date +%s) - start )) s"
