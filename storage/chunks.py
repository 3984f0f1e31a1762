"""An upload's content as rows of file_chunks: written and read a piece at a time.

Neither the server nor the database then holds a whole file in one value:
the server reads an upload from its spooled temporary file a piece at a
time, each piece is a row, and reading the content back goes a row at a time.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from fsched.core.ports.files import PIECE_BYTES as CHUNK_BYTES
from fsched.storage.models import FileChunk

file_chunks = FileChunk.__table__


def insert_chunks(conn: Connection, file_id: str, data: memoryview, created_at: float) -> int:
    """Store `data` as the pieces 0, 1, ... of `file_id`; how many were written."""
    rows = [{"file_id": file_id, "seq": i, "data": bytes(data[at:at + CHUNK_BYTES]),
             "created_at": created_at} for i, at in enumerate(range(0, len(data), CHUNK_BYTES))]
    if rows:
        conn.execute(file_chunks.insert(), rows)
    return len(rows)


def chunk_at(conn: Connection, file_id: str, seq: int) -> bytes | None:
    return conn.execute(select(file_chunks.c.data).where(file_chunks.c.file_id == file_id,
                                                         file_chunks.c.seq == seq)).scalar()
