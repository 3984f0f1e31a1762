#!/usr/bin/env bash
# The end-to-end tests against a real vLLM server (CPU build): `fsched daemon --engine URL`
# must store exactly what transformers' generate produces. The vLLM environment is created
# once by scripts/vllm_env.sh (outside the repository, cached between runs: the first run
# takes several minutes more). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FSCHED_VENV:-.venv}"
[ -x "$venv/bin/python" ] || bash scripts/bootstrap.sh
FSCHED_VLLM_PYTHON="$(bash scripts/vllm_env.sh)"
export FSCHED_VLLM_PYTHON
exec "$venv/bin/python" -m pytest -q --vllm tests/e2e "$@"
