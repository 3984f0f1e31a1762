"""The HTTP server's group commit of online requests on PostgreSQL: every request of a group waits for each
round trip of its transaction, counted here in the driver's own protocol trace; and the connection kept
for it, lost, costs no request."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from psycopg import pq
from sqlalchemy import event, text

from fsched.api.submitter import Submitter
from fsched.core.ports.records import QueueFull, StorageError, SubmittedJob
from fsched.storage import kept
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.submit import TENANTS_LOCKED, insert_jobs
from tests.support.tables import submission


class Traced:
    """The protocol messages of every connection the store opens from now on (libpq's trace)."""

    def __init__(self, store: SqlCatalogStore, path) -> None:
        self.path = path
        self.file = open(path, "w")  # noqa: SIM115 - open while the connections trace into it
        self.conns: list = []
        store.db.engine.dispose()  # those opened so far are not traced
        event.listen(store.db.engine, "connect", lambda dbapi_conn, _rec: self._opened(dbapi_conn.pgconn))

    def _opened(self, pgconn) -> None:
        self.conns.append(pgconn)
        self._trace(pgconn)

    def _trace(self, pgconn) -> None:
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def round_trips(self, call) -> int:
        """The round trips `call` makes: each a Sync (a statement's end) or a Query sent."""
        for pgconn in self.conns:
            pgconn.untrace()  # written out
        start = self.path.stat().st_size
        for pgconn in self.conns:
            self._trace(pgconn)
        call()
        for pgconn in self.conns:
            pgconn.untrace()
        with open(self.path) as f:
            f.seek(start)
            sent = [line.split("\t") for line in f if line.startswith("F\t")]
        return sum(1 for fields in sent if fields[2].split()[0] in ("Sync", "Query"))


@pytest.fixture
def store(pg_url, monkeypatch):
    monkeypatch.setattr(kept, "PING_IDLE_S", 3600.0)  # no ping, however slow the machine
    made = SqlCatalogStore(pg_url)
    yield made
    made.db.dispose()  # the kept connection too: the database can be dropped


def test_a_group_commit_is_six_round_trips(store, tmp_path):
    """BEGIN, the tenants locked with the keys read, their counts, the jobs, their requests, COMMIT:
    no ping, no idle limit set, no separate lock."""
    traced = Traced(store, tmp_path / "trace")
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)  # the tenant, a connection
    group = [submission(1, "carol") for _ in range(5)]
    outcomes: list = []
    trips = traced.round_trips(lambda: outcomes.extend(store.submit_each(group, max_queued_per_tenant=100)))
    assert trips == 6
    assert all(isinstance(o, SubmittedJob) for o in outcomes)


def test_a_group_commit_waits_for_another_servers_and_counts_its_jobs(store, pg_url):
    """Two servers on one table: the tenants are locked in the statement that reads the keys, so a
    group commit waits for the other server's under way, then counts its jobs in the queue limit."""
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=2)
    other = SqlCatalogStore(pg_url)
    outcomes: list = []
    submitting = threading.Thread(target=lambda: outcomes.extend(
        store.submit_each([submission(1, "carol")], max_queued_per_tenant=2)))
    try:
        with other.db.write() as conn:  # the other server's group commit: carol locked, a job added
            conn.execute(TENANTS_LOCKED, {"b_names": ["carol"]})
            insert_jobs(conn, [submission(1, "carol")], time.time())
            submitting.start()
            deadline = time.monotonic() + 30
            while not _waits_on_a_lock(other):
                assert submitting.is_alive(), "stored without waiting for the lock"
                assert time.monotonic() < deadline
                time.sleep(0.01)
        submitting.join()
    finally:
        other.db.dispose()
    (over,) = outcomes
    assert isinstance(over, QueueFull) and "has 2 unfinished" in str(over)


def _waits_on_a_lock(store) -> bool:
    with store.db.read() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).scalar())


def _end_other_sessions(store) -> None:
    with store.db.read() as conn:
        conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")).all()
    store.db.engine.dispose()  # the pool's own are gone too: only the kept one is left to find out


def test_a_kept_connection_the_server_ended_while_idle_is_replaced_before_use(store, monkeypatch):
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    monkeypatch.setattr(store._group_writer, "ping_idle_s", 0.0)  # idle long enough: pinged
    _end_other_sessions(store)
    (stored,) = store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    assert isinstance(stored, SubmittedJob)


def test_a_kept_connection_lost_mid_use_costs_the_server_no_request(store):
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    _end_other_sessions(store)
    with pytest.raises(StorageError):  # not pinged (in use a moment ago): the transaction finds out
        store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    _end_other_sessions(store)

    async def serve_three() -> list:
        submitter = Submitter(lambda group, limit: asyncio.to_thread(store.submit_each, group, limit))
        return await asyncio.gather(*(submitter.submit(submission(1, "carol"), 100) for _ in range(3)))

    assert all(isinstance(o, SubmittedJob) for o in asyncio.run(serve_three()))
    assert len(store.list_jobs(tenant="carol")) == 4
