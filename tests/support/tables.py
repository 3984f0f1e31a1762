"""One job table for the contract suites (tests/integration/test_*_contract.py): in memory, on SQLite or on
PostgreSQL, with the few things a test needs beyond the stores themselves.

Every contract test runs on each kind; where a rule is observed differently
(the table's clock, the pieces an upload is stored in, the error a broken
unique rule raises), the kind says how.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.memory import MemoryTable
from fsched.core.ports.records import JobSubmission, StoreError
from fsched.core.types import RequestClass, RequestStatus
from tests.fakes import FakeClock

KINDS = ["memory", "sqlite", "postgresql"]
# A lease a test lets run out: long enough that no pause of a loaded machine ends it by itself; `expire`
# moves the table's time past it (a live lease of 60 s keeps half its time).
SHORT_LEASE_S = 30.0


def submission(n: int, tenant: str = "alice", request_class: RequestClass = RequestClass.BATCH,
               name: str = "job") -> JobSubmission:
    data = "".join(json.dumps({"prompt": f"p{i}", "custom_id": f"c{i}", "max_tokens": 4}) + "\n"
                   for i in range(n))
    return JobSubmission(parse_job_file(data.encode(), "f.jsonl"), tenant, request_class, 5, name)


class ContractTable:
    """What every kind offers: the five stores, and the shorthands below."""

    kind: str
    duplicate_error: type[Exception]  # what a submit breaking (job, custom_id, choice) uniqueness raises

    def submit(self, n: int, tenant: str = "alice", request_class: RequestClass = RequestClass.BATCH) -> int:
        return self.catalog.submit([submission(n, tenant, request_class)])[0].job_id

    def cancel(self, job_id: int) -> None:
        self.catalog.cancel_job(job_id)

    def set_weight(self, tenant: str, weight: float) -> None:
        self.catalog.set_weight(tenant, weight)

    def view(self, job_id: int) -> dict[str, tuple[RequestStatus, str, int]]:
        """Request id -> (state, text, tokens), as a reader of the job sees it."""
        return {str(p.id): (p.status, p.output_text, p.num_output_tokens)
                for p in self.catalog.request_progress(job_id)}


class InMemory(ContractTable):
    kind = "memory"
    duplicate_error = StoreError

    def __init__(self, clock: Callable[[], float] | None = None, table: MemoryTable | None = None):
        self.clock = clock or FakeClock()
        self.table = table or MemoryTable(self.clock)
        t = self.table
        self.catalog, self.queue, self.keys, self.files, self.serving = (
            t.catalog, t.queue, t.keys, t.files, t.serving)

    def now(self) -> float:
        """The table's clock: what it stamps heartbeats and leases with."""
        return self.table.rows.clock()

    def expire(self) -> None:
        self.clock.advance(SHORT_LEASE_S + 1)

    def another(self) -> InMemory:
        """A second handle on the same table (another server process's stores)."""
        return InMemory(self.clock, self.table)

    def pieces_stored(self) -> int:
        """The uploads' pieces the table holds."""
        return sum(len(f.pieces) for f in self.table.rows.files.values())

    def stored_text(self) -> str:
        """Everything stored about API keys, as text."""
        return repr(self.table.rows.api_keys)

    def close(self) -> None:
        pass


class InSql(ContractTable):
    def __init__(self, url: str, clock: Callable[[], float] = time.time):
        from sqlalchemy.exc import IntegrityError

        from fsched.storage.db import Database
        from fsched.storage.sql_catalog import SqlCatalogStore
        from fsched.storage.sql_files import SqlFileStore
        from fsched.storage.sql_keys import SqlKeyStore
        from fsched.storage.sql_queue import SqlQueueStore
        from fsched.storage.sql_serving import SqlServingStore

        self.url, self.clock = url, clock
        self.kind = "sqlite" if url.startswith("sqlite") else "postgresql"
        self.duplicate_error = IntegrityError  # the database's unique constraint
        self.db = Database(url)
        self.queue = SqlQueueStore(self.db, clock)
        self.catalog = SqlCatalogStore(self.db, clock)  # every store over one Database
        self.keys = SqlKeyStore(self.db, clock)
        self.files = SqlFileStore(self.db, clock)
        self.serving = SqlServingStore(self.db)

    def now(self) -> float:
        return time.time()  # the database's clock, which this machine's shares

    def expire(self) -> None:
        """As if the database's clock moved past the short leases: every lease ends that much sooner."""
        from sqlalchemy import update

        from fsched.storage.rows import requests

        with self.db.write() as conn:
            conn.execute(update(requests).where(requests.c.lease_expires_at.is_not(None))
                         .values(lease_expires_at=requests.c.lease_expires_at - (SHORT_LEASE_S + 1)))

    def another(self) -> InSql:
        return InSql(self.url, self.clock)

    def pieces_stored(self) -> int:
        from sqlalchemy import func, select

        from fsched.storage.chunks import file_chunks

        with self.db.read() as conn:
            return conn.execute(select(func.count()).select_from(file_chunks)).scalar_one()

    def stored_text(self) -> str:
        from sqlalchemy import text

        with self.db.read() as conn:
            return str(conn.execute(text("SELECT * FROM api_keys")).all())

    def close(self) -> None:
        self.db.dispose()


def open_table(request: pytest.FixtureRequest, kind: str,
               clock: Callable[[], float] | None = None) -> ContractTable:
    """A fresh table of `kind` (PostgreSQL skipped where none runs, as the `pg_url` fixture does)."""
    if kind == "memory":
        return InMemory(clock)
    url = request.getfixturevalue("pg_url" if kind == "postgresql" else "sqlite_url")
    return InSql(url, clock or time.time)
