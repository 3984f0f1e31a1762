"""A daemon keeps PostgreSQL's planner statistics of its tables fresh (storage/statistics.py): a table
that grew since its last ANALYZE is analyzed again, on the keeper's own thread, and one that did not is
left alone."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from fsched.storage.db import Database
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.statistics import MIN_CHANGES, StatisticsKeeper
from tests.support.tables import submission

STATS_WAIT_S = 20.0  # the server shows a session's changes once it flushes its counts (at most ~10 s)


def _changes(db: Database) -> dict[str, int]:
    with db.read() as conn:
        return dict(conn.execute(text("SELECT relname, n_mod_since_analyze FROM pg_stat_user_tables "
                                      "WHERE relname IN ('jobs', 'requests')")).all())


def _grown(pg_url: str, jobs: int) -> None:
    """`jobs` jobs of one request stored, and the writer's sessions ended (which sends their counts)."""
    store = SqlJobStore(pg_url)
    for _ in range(jobs // 100):
        store.submit([submission(1) for _ in range(100)])
    store.db.dispose()


def _analyzed_by(keeper: StatisticsKeeper, deadline_s: float) -> set[str]:
    found: set[str] = set()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and found != {"jobs", "requests"}:
        found |= set(keeper.check())
        time.sleep(0.2)
    return found


def test_a_table_that_grew_is_analyzed_and_then_left_alone(pg_url):
    _grown(pg_url, MIN_CHANGES + 100)
    db = Database(pg_url)
    keeper = StatisticsKeeper(db)
    assert _analyzed_by(keeper, STATS_WAIT_S) == {"jobs", "requests"}
    with db.read() as conn:
        believed = dict(conn.execute(text(
            "SELECT relname, reltuples FROM pg_class WHERE relname IN ('jobs', 'requests')")).all())
    assert believed == {"jobs": MIN_CHANGES + 100, "requests": MIN_CHANGES + 100}  # the planner's rows now
    assert all(n < MIN_CHANGES for n in _changes(db).values())
    assert keeper.check() == []  # nothing changed since
    keeper.close()
    db.dispose()


def test_a_connection_the_server_ended_is_replaced_at_the_next_check(pg_url):
    db = Database(pg_url)
    SqlJobStore(db)  # the schema
    keeper = StatisticsKeeper(db)
    assert keeper.check() == []
    with db.read() as conn:  # the server ends the keeper's session (a restart, an administrator)
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE pid <> pg_backend_pid() AND datname = current_database()"))
    with pytest.raises(Exception):  # noqa: B017 - the driver's own error, whichever it is
        keeper.check()
    assert keeper.check() == []  # a new connection
    keeper.close()
    db.dispose()


def test_the_keepers_thread_analyzes_on_its_own_and_stops_when_closed(pg_url):
    _grown(pg_url, MIN_CHANGES + 100)
    db = Database(pg_url)
    keeper = StatisticsKeeper(db, every_s=0.2)
    keeper.start()
    try:
        end = time.monotonic() + STATS_WAIT_S
        while keeper.analyzed < 2 and time.monotonic() < end:
            time.sleep(0.1)
        assert keeper.analyzed == 2
    finally:
        keeper.close()
    assert not any(t.name == "fsched-statistics" and t.is_alive() for t in threading.enumerate())
    db.dispose()


def test_on_sqlite_no_thread_is_started(sqlite_url):
    store = SqlJobStore(sqlite_url)
    store.keep_statistics()
    assert store._statistics is not None and store._statistics._thread is None


def test_a_role_that_may_not_analyze_is_warned_of_once_and_not_tried_again(pg_url, caplog):
    import uuid

    from sqlalchemy.engine import make_url

    _grown(pg_url, MIN_CHANGES + 100)
    role = f"fsched_test_analyst_{uuid.uuid4().hex[:8]}"
    owner = Database(pg_url)
    _autocommit(owner, f'CREATE ROLE "{role}" LOGIN')
    try:
        db = Database(make_url(pg_url).set(username=role).render_as_string(hide_password=False))
        keeper = StatisticsKeeper(db)
        with caplog.at_level("WARNING", logger="fsched.daemon"):
            end = time.monotonic() + STATS_WAIT_S
            while keeper.analyzed == 0 and time.monotonic() < end:
                keeper.check()
                time.sleep(0.2)
            tried = keeper.analyzed
            assert keeper.check() == []  # the tables are still stale, and not tried again
        keeper.close()
        assert tried == 2 and keeper.analyzed == 2
        assert [r.getMessage() for r in caplog.records if "cannot analyze" in r.getMessage()] == [
            "cannot analyze the jobs table (is the database role its owner?): its planner statistics are "
            "left to autovacuum",
            "cannot analyze the requests table (is the database role its owner?): its planner statistics are "
            "left to autovacuum"]
        assert all(n >= MIN_CHANGES for n in _changes(owner).values())  # nobody analyzed them
        db.dispose()
    finally:
        _autocommit(owner, f'DROP ROLE IF EXISTS "{role}"')
        owner.dispose()


def _autocommit(db: Database, sql: str) -> None:
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(sql)
