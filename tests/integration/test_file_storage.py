"""Uploads in pieces, a per-tenant quota on their bytes, and deleted files' space given back, on SQLite
and PostgreSQL; databases before the pieces are upgraded."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import make_url

from fsched.storage import schema
from fsched.storage.chunks import CHUNK_BYTES, file_chunks
from fsched.storage.models import FileRow
from fsched.storage.sql_files import SqlFileStore


@pytest.fixture
def files(db_url) -> SqlFileStore:
    store = SqlFileStore(schema_db(db_url))
    yield store
    store.db.dispose()


def schema_db(url):
    from fsched.storage.db import Database

    return Database(url)


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def chunk_rows(files: SqlFileStore) -> int:
    with files.db.read() as conn:
        return conn.execute(select(func.count()).select_from(file_chunks)).scalar_one()


def test_deleting_a_file_gives_its_space_back(files):
    f = files.add_file("alice", "batch", "big.jsonl", io.BytesIO(blob(16 * CHUNK_BYTES)))
    files.add_file("alice", "batch", "small.jsonl", b"keep me\n")
    if files.db.dialect == "sqlite":
        path = Path(make_url(files.db.url).database)
        files.db.reclaim_space()
        full = path.stat().st_size
        assert full > 16 * CHUNK_BYTES
    assert files.delete_file("alice", f.id)
    assert chunk_rows(files) == 1 and files.iter_content("alice", f.id) is None
    if files.db.dialect == "sqlite":
        wal = Path(str(path) + "-wal")
        assert path.stat().st_size < full / 8, (path.stat().st_size, full)
        assert not wal.exists() or wal.stat().st_size == 0
        with files.db.read() as conn:
            assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2


def test_uploads_stopped_midway_are_swept_after_an_hour(files):
    with files.db.write() as conn:
        conn.execute(file_chunks.insert().values(file_id="file-stopped", seq=0, data=b"x", created_at=1.0))
    files.add_file("alice", "batch", "new.jsonl", b"y")
    assert chunk_rows(files) == 1


def test_a_version_7_table_moves_its_uploads_into_pieces(db_url):
    store = SqlFileStore(schema_db(db_url))
    data = blob(CHUNK_BYTES + 7)
    with store.db.write() as conn:  # back to a version-7 table: content in the files row
        for table in ("file_chunks", "key_limits", "key_rates"):
            conn.execute(text(f"DROP TABLE {table}"))
        kind = "BYTEA" if store.db.dialect == "postgresql" else "BLOB"
        conn.execute(text(f"ALTER TABLE files ADD COLUMN content {kind}"))
        conn.execute(FileRow.__table__.insert().values(id="file-old", tenant="alice", purpose="batch",
                                                      filename="old.jsonl", bytes=len(data), created_at=1.0,
                                                      errors=0))
        conn.execute(text("UPDATE files SET content = :c WHERE id = 'file-old'"), {"c": data})
        conn.execute(text("UPDATE fsched_meta SET value = '7' WHERE key = 'schema_version'"))
    store.db.dispose()
    if store.db.dialect == "sqlite":  # as a file made before incremental vacuum
        import sqlite3

        raw = sqlite3.connect(make_url(db_url).database)
        raw.execute("PRAGMA auto_vacuum = NONE")
        raw.execute("VACUUM")
        raw.close()
    assert schema.ensure_schema(store.db) == 7
    with store.db.read() as conn:
        assert "content" not in {c["name"] for c in inspect(conn).get_columns("files")}
        assert {"file_chunks", "key_limits", "key_rates"} <= set(inspect(conn).get_table_names())
        if store.db.dialect == "sqlite":
            assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2
    assert store.file_content("alice", "file-old") == data and chunk_rows(store) == 2
    store.db.dispose()
