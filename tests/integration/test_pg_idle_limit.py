"""PostgreSQL ends a write transaction left idle past a short limit (a stalled client must not hold its
row locks), except the schema's own: creating or migrating it may pause between statements on a loaded
machine, and must not be cut off half-way. A read takes no row locks: a pause between its statements
(a client descheduled on a loaded machine) does not cost it its connection."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from fsched.storage import db as db_module
from fsched.storage import schema
from fsched.storage.db import Database

LIMIT_MS = 300  # every write transaction's limit here (2 s in use): the pauses below pass it
PAUSE_S = 1.0


@pytest.fixture
def db(pg_url, monkeypatch) -> Database:
    monkeypatch.setattr(db_module, "PG_IDLE_IN_TRANSACTION_MS", LIMIT_MS)
    made = Database(pg_url)
    schema.ensure_schema(made, version=1)
    return made


def test_a_migration_that_pauses_past_the_idle_limit_completes(db):
    def slow_step(conn):
        time.sleep(PAUSE_S)  # the client busy between two statements
        conn.execute(text("CREATE TABLE after_the_pause (x INTEGER)"))

    assert schema.ensure_schema(db, version=2, migrations={1: slow_step}) == 1
    assert schema.ensure_schema(db, version=2, migrations={1: slow_step}) == 2
    with db.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM after_the_pause")).scalar() == 0


def test_any_other_transaction_that_pauses_past_it_is_ended(db):
    with pytest.raises(Exception, match="connection lost"):
        with db.write() as conn:
            conn.execute(text("SELECT 1"))
            time.sleep(PAUSE_S)
            conn.execute(text("SELECT 1"))


def test_a_read_that_pauses_past_the_write_limit_completes(db):
    with db.read() as conn:
        conn.execute(text("SELECT 1"))
        time.sleep(PAUSE_S)
        assert conn.execute(text("SELECT 2")).scalar() == 2
