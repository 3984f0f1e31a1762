"""Run the real `fsched` command in a subprocess against a private job table."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import TABLE_COMMANDS, invoke
from tests.support.model_cache import shared_model_cache

FSCHED = str(Path(sys.executable).parent / "fsched")
REPO = Path(__file__).resolve().parents[2]
SAMPLE_JOBS = REPO / "sample_jobs"


@dataclass
class Fsched:
    db_path: Path
    env: dict
    # Run the table commands in this process (typer's CliRunner; tests/support/cli.py), for a file whose
    # subject is the daemon or the server: each `fsched` process costs a second of CPU in imports. The
    # executable itself is tested by the files that leave this off.
    in_process: bool = False

    def run(
        self, *args: str, input: str | bytes | None = None, env: dict | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        if self.in_process and args and args[0] in TABLE_COMMANDS:
            return invoke(args, {**self.env, **(env or {})}, input=input)
        return subprocess.run(
            [FSCHED, *args],
            input=input.encode() if isinstance(input, str) else input,
            capture_output=True,
            env={**self.env, **(env or {})},
            timeout=timeout,
        )

    def ok(self, *args: str, **kw) -> str:
        proc = self.run(*args, **kw)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout.decode()

    def dump(self) -> dict:
        """Every row of every table: what 'the table is unchanged' compares."""
        if not self.db_path.exists():
            return {}
        conn = sqlite3.connect(self.db_path)
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in sorted(tables)}
        finally:
            conn.close()


def fsched_at(folder: Path) -> Fsched:
    """`fsched` on a new SQLite job table in `folder`, with none of the caller's FSCHED_ settings."""
    db_path = folder / "state" / "fsched.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}
    env.update(FSCHED_DB=f"sqlite:///{db_path}", USER="tester", LOGNAME="tester", COLUMNS="160")
    return Fsched(db_path=db_path, env=env)


@pytest.fixture
def fsched(tmp_path) -> Fsched:
    return fsched_at(tmp_path)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> str:
    """One tiny model for every daemon of the session (built by the first one)."""
    return shared_model_cache(tmp_path_factory)


@pytest.fixture
def fs(fsched: Fsched, model_cache) -> Fsched:
    """`fsched` whose daemons share the session's tiny model."""
    fsched.env["XDG_CACHE_HOME"] = model_cache
    return fsched
