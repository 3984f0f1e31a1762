"""Uploads in pieces, a per-tenant quota on their bytes, and deleted files' space given back, on SQLite
and PostgreSQL; databases before the pieces are upgraded."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import make_url

from fsched.core.ports.records import FileQuotaExceeded
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


def test_an_upload_is_stored_and_read_back_in_pieces(files):
    data = blob(2 * CHUNK_BYTES + 12345)
    f = files.add_file("alice", "batch", "in.jsonl", io.BytesIO(data))
    assert f.bytes == len(data) and chunk_rows(files) == 3
    assert files.file_content("alice", f.id) == data
    parts = list(files.iter_content("alice", f.id))
    assert [len(p) for p in parts] == [CHUNK_BYTES, CHUNK_BYTES, 12345] and b"".join(parts) == data
    assert files.iter_content("bob", f.id) is None and files.file_content("bob", f.id) is None
    assert files.add_file("alice", "batch", "empty.jsonl", b"").bytes == 0
    assert files.stored_bytes("alice") == len(data) and files.stored_bytes("bob") == 0


class Unreadable(io.RawIOBase):
    def read(self, size=-1):
        raise AssertionError("the quota should have refused this upload before reading it")


def test_the_quota_takes_an_upload_at_it_and_refuses_one_byte_past(files):
    first = files.add_file("alice", "batch", "a.jsonl", blob(1000), quota=3000)
    at_quota = files.add_file("alice", "batch", "b.jsonl", io.BytesIO(blob(2000)), quota=3000)
    assert files.stored_bytes("alice") == 3000
    rows_before = chunk_rows(files)
    with pytest.raises(FileQuotaExceeded, match="quota of 3,000 bytes"):
        files.add_file("alice", "batch", "c.jsonl", io.BytesIO(b"x"), quota=3000)
    with pytest.raises(FileQuotaExceeded):  # the declared size refuses before a byte is read
        files.add_file("alice", "batch", "d.jsonl", Unreadable(), quota=3000, size_hint=1)
    assert chunk_rows(files) == rows_before and len(files.list_files("alice")) == 2  # nothing stored
    assert files.add_file("bob", "batch", "b", blob(3000), quota=3000).bytes == 3000  # others: their own
    assert files.delete_file("alice", first.id)  # room again
    assert files.add_file("alice", "batch", "c.jsonl", blob(1000), quota=3000).bytes == 1000
    assert files.file_content("alice", at_quota.id) == blob(2000)


def test_a_refused_upload_larger_than_a_piece_leaves_no_pieces(files):
    with pytest.raises(FileQuotaExceeded):
        files.add_file("alice", "batch", "big", io.BytesIO(blob(3 * CHUNK_BYTES)), quota=CHUNK_BYTES + 1)
    assert chunk_rows(files) == 0 and files.list_files("alice") == []


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
