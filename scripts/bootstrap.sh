#!/usr/bin/env bash
# Create the virtual environment and install fsched with its test tools.
#   FSCHED_VENV     where (default .venv)
#   FSCHED_INSTALL  "editable" (default: source edits take effect at once) or
#                   "wheel" (a plain `pip install .`, as a user gets; CI uses it)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FSCHED_VENV:-.venv}"
mode="${FSCHED_INSTALL:-editable}"

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
# torch first, pinned to the CPU wheel on this machine's disk: the package's
# own range then installs nothing more (never a multi-GB CUDA build).
"$py" -m pip install -q "torch==2.13.0"
case "$mode" in
  editable) "$py" -m pip install -q -e ".[test]" ;;
  wheel) "$py" -m pip install -q --force-reinstall --no-deps . && "$py" -m pip install -q ".[test]" ;;
  *) echo "FSCHED_INSTALL must be editable or wheel, not $mode" >&2; exit 2 ;;
esac
# instructor, for the agent tests, apart and without its dependencies: its only release taking openai 3.x
# (1.17.0) pins jiter<0.15, while openai 3.3.1 and later need jiter>=0.16, so a resolver refuses the pair.
# Beside jiter 0.19 it runs unchanged; of what it requires, only docstring-parser is not already there
# (aiohttp is imported by its usage CLI alone).
"$py" -m pip install -q --no-deps "instructor==1.17.0" "docstring-parser>=0.16"
"$py" -c "import torch, transformers, fsched.cli.main; print('== fsched ready: torch', torch.__version__, '| transformers', transformers.__version__)"
