"""An upload's content as rows of file_chunks: written and read a piece at a time.

Neither the server nor the database then holds a whole file in one value:
the server reads an upload from its spooled temporary file a piece at a
time, each piece is a row, and reading the content back goes a row at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import Connection, select

from fsched.storage.models import FileChunk

CHUNK_BYTES = 1024 * 1024
file_chunks = FileChunk.__table__


def insert_chunks(conn: Connection, file_id: str, data: memoryview, created_at: float) -> int:
    """Store `data` as the pieces 0, 1, ... of `file_id`; how many were written."""
    rows = [{"file_id": file_id, "seq": i, "data": bytes(data[at:at + CHUNK_BYTES]),
             "created_at": created_at} for i, at in enumerate(range(0, len(data), CHUNK_BYTES))]
    if rows:
        conn.execute(file_chunks.insert(), rows)
    return len(rows)


def pieces(reader, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """A binary file's (or bytes') content in pieces of `size` bytes."""
    if isinstance(reader, bytes | bytearray | memoryview):
        view = memoryview(reader)
        for at in range(0, len(view), size):
            yield bytes(view[at:at + size])
        return
    while piece := reader.read(size):
        yield piece


def chunk_at(conn: Connection, file_id: str, seq: int) -> bytes | None:
    return conn.execute(select(file_chunks.c.data).where(file_chunks.c.file_id == file_id,
                                                         file_chunks.c.seq == seq)).scalar()
