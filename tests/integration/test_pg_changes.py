"""PostgreSQL's change notices (storage/changes.py): a daemon's check says "may have changed" after a change
its sync reads, and not after the rest (tokens, heartbeats); a look is forced every `force_s`; a table
without the triggers, or a migrated one, behaves as it should."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from fsched.storage import changes, schema
from fsched.storage.changes import ChangeListener
from fsched.storage.db import Database
from fsched.storage.models import Base

JOBS = Base.metadata.tables["jobs"]
REQUESTS = Base.metadata.tables["requests"]

@pytest.fixture
def db(pg_url):
    database = Database(pg_url)
    schema.ensure_schema(database)
    with database.write() as conn:
        conn.execute(text("INSERT INTO tenants (name, weight, created_at) VALUES ('alice', 1, 0)"))
        conn.execute(JOBS.insert().values({"id": 1, "tenant": "alice", "class": "batch", "name": "j",
                                          "state": "queued", "num_requests": 1, "submitted_at": 0.0}))
    yield database
    database.dispose()


def noticed(listener: ChangeListener, within_s: float = 2.0) -> bool:
    """Whether the listener says "changed" within `within_s` (a notice arrives after its commit)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if listener.changed(time.monotonic()):
            return True
        time.sleep(0.01)
    return False


def write(db: Database, sql) -> None:
    with db.write() as conn:
        conn.execute(text(sql) if isinstance(sql, str) else sql)


A_REQUEST = REQUESTS.insert().values(id=1, job_id=1, idx=0, custom_id="r", endpoint="completions", params={},
                                     max_tokens=8, state="queued", enqueued_at=0.0)


def test_a_change_a_sync_reads_is_noticed_and_the_rest_is_not(db):
    listener = ChangeListener(db.driver_connection, force_s=3600)
    assert listener.changed(time.monotonic())  # the first look: what came before it is unknown
    assert not noticed(listener, 0.2)
    for sql in (A_REQUEST, "UPDATE requests SET state = 'running' WHERE id = 1",
                "UPDATE tenants SET weight = 3 WHERE name = 'alice'",
                "UPDATE jobs SET cancel_requested_at = 1 WHERE id = 1",
                "INSERT INTO tenants (name, weight, created_at) VALUES ('bob', 1, 0)"):
        write(db, sql)
        assert noticed(listener), sql
        assert not noticed(listener, 0.2), sql  # drained: said once
    for sql in ("UPDATE requests SET num_output_tokens = 3 WHERE id = 1",
                "UPDATE jobs SET num_output_tokens = 5 WHERE id = 1",
                "INSERT INTO fsched_meta (key, value) VALUES ('x', 'y')"):
        write(db, sql)
        assert not noticed(listener, 0.3), sql
    listener.close()


def test_one_check_takes_every_notice_that_came(db):
    listener = ChangeListener(db.driver_connection, force_s=3600)
    listener.changed(time.monotonic())
    for weight in range(2, 7):
        write(db, f"UPDATE tenants SET weight = {weight} WHERE name = 'alice'")
    time.sleep(0.1)
    assert listener.changed(time.monotonic())
    assert not noticed(listener, 0.2)
    listener.close()


def test_a_look_is_forced_once_a_period_and_a_lost_connection_means_look(db):
    listener = ChangeListener(db.driver_connection, force_s=0.3)
    assert listener.changed(time.monotonic())
    assert not listener.changed(time.monotonic())
    time.sleep(0.35)
    assert listener.changed(time.monotonic())
    assert not listener.changed(time.monotonic())
    listener._conn.close()  # the server went away, say
    assert listener.changed(time.monotonic())
    assert listener.changed(time.monotonic())  # connected again: the first look after it
    assert not listener.changed(time.monotonic())
    listener.close()


def test_without_the_triggers_every_check_says_look(db):
    for table in changes.NOTIFYING:
        write(db, f"DROP TRIGGER {changes.trigger_name(table)} ON {table}")
    listener = ChangeListener(db.driver_connection, force_s=3600)
    assert all(listener.changed(time.monotonic()) for _ in range(3))
    assert not listener.usable


def test_the_migration_gives_an_older_table_its_triggers(db):
    for table in changes.NOTIFYING:
        write(db, f"DROP TRIGGER {changes.trigger_name(table)} ON {table}")
    write(db, f"UPDATE fsched_meta SET value = '{schema.SCHEMA_VERSION - 1}' WHERE key = 'schema_version'")
    assert schema.ensure_schema(db) == schema.SCHEMA_VERSION - 1
    listener = ChangeListener(db.driver_connection, force_s=3600)
    listener.changed(time.monotonic())
    assert listener.usable
    write(db, "UPDATE tenants SET weight = 2 WHERE name = 'alice'")
    assert noticed(listener)
    listener.close()


def test_the_database_check_uses_the_notices(db):
    assert db.changed()
    assert not db.changed()
    write(db, "UPDATE tenants SET weight = 5 WHERE name = 'alice'")
    time.sleep(0.05)
    assert db.changed()
