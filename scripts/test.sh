#!/usr/bin/env bash
# The test command: set up the environment, make sure PostgreSQL answers, run pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x). With pytest-xdist installed and
# no -n/-p/--dist among them, the tests run on two workers, one test file per worker at a time
# (--dist loadfile: a file's module and session fixtures are built once), the slowest files first
# (tests/conftest.py's SLOW_FILES; --no-loadscope-reorder keeps that order); FSCHED_TEST_WORKERS=0
# runs them in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
venv="${FSCHED_VENV:-.venv}"

if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "== starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

workers=()
if [ "${FSCHED_TEST_WORKERS:-2}" != 0 ] && "$venv/bin/python" -c "import xdist" 2>/dev/null; then
  workers=(-n "${FSCHED_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
  for arg in "$@"; do
    case "$arg" in
      -n|-n*|--numprocesses*|-p|-p*|--dist*) workers=() ;;
    esac
  done
fi

exec "$venv/bin/python" -m pytest ${workers[@]+"${workers[@]}"} "$@"
