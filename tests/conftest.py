"""Shared fixtures: a fresh job table on SQLite, and on PostgreSQL where one runs."""

from __future__ import annotations

import os
import uuid

import pytest


# The chaos suite's long variant (tests/chaos): an option of the whole run, so `pytest --long N` works
# from the repository root as well as `pytest tests/chaos --long N`.
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "fsched reliability suite")
    group.addoption(
        "--long", type=float, default=0.0, metavar="SECONDS",
        help="run the long chaos loop (tests/chaos/test_long.py) for this many seconds, and the long "
             "variants of slow tests (10 kills of 100 requests in the crash-resume acceptance test, 10 "
             "kills a crash point in tests/chaos/test_kill_points.py, the real-model PostgreSQL cluster "
             "test, and schemathesis fuzzing for that many seconds instead of 10 cases an operation)",
    )
    group.addoption("--chaos-seed", type=int, default=None, help="seed of the long loop (default: random)")
    parser.addoption("--vllm", action="store_true", default=False,
                     help="run the end-to-end tests against a real vLLM server (tests/e2e; minutes)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs a real vLLM server (run with --vllm)")
    config.addinivalue_line("markers", "long: a slow case another test covers in short; runs with --long")


# The slowest files, slowest first (by their summed test times, setup included, in the junit report of a
# whole run on 2 cores, less what later changes to a file saved, measured on the file alone). Run first, so
# that under `--dist loadfile --no-loadscope-reorder` (scripts/test.sh) the two workers end together instead
# of one starting a long file when the other is nearly done. Files not named keep their order after.
SLOW_FILES = (
    "tests/integration/test_engine.py",
    "tests/acceptance/test_daemon.py",
    "tests/chaos/test_kill_points.py",
    "tests/acceptance/test_tool_call_resume.py",
    "tests/acceptance/test_cluster.py",
    "tests/chaos/test_storage_faults.py",
    "tests/acceptance/test_online_path.py",
    "tests/acceptance/test_remote_engine.py",
    "tests/acceptance/test_grammar_isolation.py",
    "tests/acceptance/test_agents.py",
    "tests/chaos/test_fuzz.py",
    "tests/chaos/test_load.py",
    "tests/acceptance/test_clients.py",
    "tests/acceptance/test_poison_pill.py",
    "tests/acceptance/test_schemathesis.py",
    "tests/acceptance/test_http_hostile.py",
    "tests/acceptance/test_packaging.py",
    "tests/acceptance/test_generate_demo.py",
    "tests/unit/test_scheduler_fairness.py",
    "tests/acceptance/test_cli.py",
    "tests/acceptance/test_dashboard.py",
    "tests/acceptance/test_prometheus.py",
    "tests/acceptance/test_response_template.py",
    "tests/acceptance/test_access.py",
    "tests/acceptance/test_replay.py",
    "tests/integration/test_catalog_contract.py",
    "tests/acceptance/test_terminal.py",
    "tests/acceptance/test_labelling_attack.py",
    "tests/acceptance/test_client_gone.py",
    "tests/acceptance/test_http.py",
    "tests/integration/test_structured_output.py",
    "tests/integration/test_files_contract.py",
    "tests/integration/test_queue_contract.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(SLOW_FILES)))
    if not config.getoption("--long"):
        slow = pytest.mark.skip(reason="runs with --long")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(slow)
    if config.getoption("--vllm"):
        return
    skip = pytest.mark.skip(reason="needs --vllm (a real vLLM server; scripts/test_vllm.sh)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


PG_ADMIN_URL = os.environ.get("FSCHED_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_admin_connect():
    import psycopg

    url = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    return psycopg.connect(url, autocommit=True, connect_timeout=3)


@pytest.fixture(scope="session")
def pg_available() -> bool:
    try:
        with _pg_admin_connect():
            return True
    except Exception:
        return False


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'data' / 'fsched.db'}"


@pytest.fixture
def pg_url(pg_available):
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    if not pg_available:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not reachable at " + PG_ADMIN_URL)
        pytest.skip("PostgreSQL is not reachable")
    name = f"fsched_test_{uuid.uuid4().hex[:12]}"
    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with _pg_admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Run a storage test against both backends."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")
