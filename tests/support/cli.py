"""The `fsched` commands run in process (typer's CliRunner) over an in-memory job table (`Commands`), or
over any job table (`invoke`).

`Commands` reads as the acceptance tests' `Fsched` does (`run`, `ok`, `dump`),
without a subprocess or a database: each command opens the table by its
`memory:NAME` URL (FSCHED_DB), as it opens an SQLite file by path, and finds
what the command before it left. The table was made by this process, so its
user is an admin of it (as the owner of an SQLite file is); `act_as` makes the
commands run as another OS user instead.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from unittest import mock

import pytest
from typer.testing import CliRunner

from fsched.cli.main import app
from fsched.core.jobs.access import Actor
from fsched.core.ports.memory import MemoryTable
from fsched.storage import stores
from fsched.storage.stores import forget_memory_table, open_table


@dataclass(frozen=True)
class Ran:
    """A command's outcome, as a finished process's."""

    returncode: int
    stdout: bytes
    stderr: bytes


# The commands that only read or write the job table: what the acceptance and chaos helpers may run in
# process (`invoke`) where the daemon or the server is what a test runs as a user does.
TABLE_COMMANDS = frozenset({"submit", "status", "cancel", "results", "purge", "tenants", "keys", "limits"})


def invoke(args, env: dict, input: str | bytes | None = None) -> Ran:
    """`fsched ARGS` in this process, with `env` as its environment. A job table on a database that the
    command opened is closed after it, as its process's exit would close it."""
    opened: list[stores.JobTable] = []

    class Closed(stores.JobTable):
        def __init__(self, url: str | None = None):
            super().__init__(url)
            opened.append(self)

    with mock.patch.object(stores, "JobTable", Closed):
        try:
            result = CliRunner().invoke(app, list(args), input=input, env=env, prog_name="fsched",
                                        catch_exceptions=False)
        finally:
            for table in opened:
                table.dispose()
    return Ran(result.exit_code, result.stdout_bytes, result.stderr_bytes)


class Commands:
    def __init__(self) -> None:
        self.url = f"memory:{uuid.uuid4().hex}"
        self.table: MemoryTable = open_table(self.url)
        self.env = {name: None for name in os.environ if name.startswith("FSCHED_")}
        self.env.update(FSCHED_DB=self.url, USER="tester", LOGNAME="tester", COLUMNS="160")

    def run(self, *args: str, input: str | bytes | None = None, env: dict | None = None) -> Ran:
        return invoke(args, {**self.env, **(env or {})}, input=input)

    def ok(self, *args: str, **kw) -> str:
        ran = self.run(*args, **kw)
        assert ran.returncode == 0, ran.stderr.decode()
        return ran.stdout.decode()

    def dump(self) -> dict:
        """Every row of every table: what 'the table is unchanged' compares."""
        rows = self.table.rows
        tables = {"tenants": rows.tenants, "jobs": rows.jobs, "requests": rows.requests,
                  "api_keys": rows.api_keys, "limits": rows.limits, "key_limits": rows.key_limits,
                  "files": rows.files, "batches": rows.batches}
        return {name: sorted(map(repr, table.items())) for name, table in tables.items()}

    def close(self) -> None:
        forget_memory_table(self.url)


def act_as(monkeypatch: pytest.MonkeyPatch, user: str, admin: bool = False) -> None:
    """The commands run as OS user `user` (an fsched admin or not), whoever runs the tests."""
    actor = Actor(user, admin=admin, why_admin="member of group fsched-admin" if admin else None)
    monkeypatch.setattr("fsched.core.jobs.access.local_actor", lambda db_owner_uid: actor)
