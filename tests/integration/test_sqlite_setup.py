"""SQLite specifics: file modes, WAL, BEGIN IMMEDIATE, schema versions, clear errors."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest
from sqlalchemy import text

from fsched.core.ports.records import SchemaMismatch, StorageError
from fsched.storage import schema
from fsched.storage.db import Database, default_database_path, resolve_database_url
from fsched.storage.jobstore import SqlJobStore


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_fresh_database_is_private_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        store = SqlJobStore(f"sqlite:///{tmp_path / 'new' / 'fsched.db'}")
        store.add_tenant("alice")
    finally:
        os.umask(old)
    folder = tmp_path / "new"
    assert mode(folder) == 0o700
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["fsched.db", "fsched.db-shm", "fsched.db-wal"]
    for name in files:
        assert mode(folder / name) == 0o600, name


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("FSCHED_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_database_path() == tmp_path / "fsched" / "fsched.db"
    assert resolve_database_url() == f"sqlite:///{tmp_path}/fsched/fsched.db"
    monkeypatch.setenv("FSCHED_DB", "sqlite:////x/y.db")
    assert resolve_database_url() == "sqlite:////x/y.db"
    assert resolve_database_url("rel.db").endswith("/rel.db")  # --db wins, a path is SQLite


def test_wal_and_begin_immediate_are_live(sqlite_url):
    db = Database(sqlite_url)
    SqlJobStore(db)
    path = sqlite_url.removeprefix("sqlite:///")
    with db.read() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with db.write():
        # Our write transaction took the write lock at BEGIN, before any write:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    with db.read():
        other.execute("BEGIN IMMEDIATE")  # a reader does not block a writer (WAL)
        other.execute("ROLLBACK")
    other.close()


def test_deferred_begin_would_fail_where_immediate_waits(sqlite_url):
    """The reason for BEGIN IMMEDIATE: two deferred read-then-write transactions deadlock."""
    SqlJobStore(sqlite_url).add_tenant("t")
    path = sqlite_url.removeprefix("sqlite:///")
    a = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    b = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    a.execute("BEGIN")
    b.execute("BEGIN")
    a.execute("SELECT weight FROM tenants").fetchall()
    b.execute("SELECT weight FROM tenants").fetchall()
    a.execute("UPDATE tenants SET weight = 2")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        b.execute("UPDATE tenants SET weight = 3")  # cannot upgrade: busy timeout does not help
    a.execute("COMMIT")
    b.execute("ROLLBACK")
    a.close()
    b.close()


def test_schema_version_is_recorded_and_a_newer_one_refused(sqlite_url):
    db = Database(sqlite_url)
    assert schema.ensure_schema(db) == 0  # created
    assert schema.ensure_schema(db) == schema.SCHEMA_VERSION  # already current
    with db.write() as conn:
        conn.execute(text("UPDATE fsched_meta SET value = '99' WHERE key = 'schema_version'"))
    with pytest.raises(SchemaMismatch, match="schema version 99, newer"):
        SqlJobStore(db)


def test_migrations_run_in_order_from_the_stored_version(sqlite_url):
    db = Database(sqlite_url)
    schema.ensure_schema(db)
    applied = []

    def add_column(conn):
        applied.append(1)
        conn.execute(text("ALTER TABLE tenants ADD COLUMN note TEXT"))

    def fill_column(conn):
        applied.append(2)
        conn.execute(text("UPDATE tenants SET note = 'migrated'"))

    current = schema.SCHEMA_VERSION
    steps = {current: add_column, current + 1: fill_column}
    assert schema.ensure_schema(db, version=current + 2, migrations=steps) == current
    assert applied == [1, 2]
    assert schema.ensure_schema(db, version=current + 2, migrations=steps) == current + 2  # nothing re-run
    assert applied == [1, 2]
    with pytest.raises(SchemaMismatch, match=f"no migration from schema version {current + 2}"):
        schema.ensure_schema(db, version=current + 3, migrations=steps)


def test_unusable_locations_give_clear_errors(tmp_path):
    with pytest.raises(StorageError, match="not a regular file"):
        (tmp_path / "dir.db").mkdir()
        Database(f"sqlite:///{tmp_path / 'dir.db'}")
    with pytest.raises(StorageError, match="in-memory"):
        Database("sqlite://")
    with pytest.raises(StorageError, match="not a database URL|cannot use"):
        Database("nosuchdb://x/y")
