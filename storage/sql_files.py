"""The Batch API's files and batches in the job table, always read and written per tenant.

Every read names the tenant, so one tenant's id never finds another's file or
batch: the server answers both "unknown" and "not yours" alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from sqlalchemy import and_, delete, func, or_, select, update

from fsched.core.jobs.batches import OUTPUT_PURPOSE, BatchRecord, StoredFile, new_file_id
from fsched.core.ports.files import pieces
from fsched.core.ports.records import FileQuotaExceeded
from fsched.core.types import JobState
from fsched.storage.chunks import chunk_at, file_chunks
from fsched.storage.db import Database
from fsched.storage.logprobs import request_logprobs
from fsched.storage.models import BatchRow, FileRow, Job, RequestRow
from fsched.storage.schema import ensure_schema

files = FileRow.__table__
STOPPED_UPLOAD_S = 3600.0
batches = BatchRow.__table__
jobs = Job.__table__
requests = RequestRow.__table__
RUNNING_JOB_STATES = [JobState.QUEUED.value, JobState.IN_PROGRESS.value]  # not ended, nor cancelling
ENDED_JOB_STATES = [state.value for state in JobState if state.finished]
# Request rows a reclaim deletes in one transaction (with their logprobs pieces): a few milliseconds of
# write lock for rows of a few KB; a line is at most 1 MiB (max_line_bytes), so never more than that
# many MiB.
RECLAIM_PIECE_ROWS = 500
FILE_COLUMNS = (files.c.id, files.c.tenant, files.c.purpose, files.c.filename, files.c.bytes,
                files.c.created_at, files.c.job_id, files.c.errors)


class SqlFileStore:
    def __init__(self, db: Database, clock=time.time):
        self.db = db
        self.clock = clock
        ensure_schema(self.db)

    # -- files --------------------------------------------------------------------------------

    def add_file(self, tenant: str, purpose: str, filename: str, content: bytes | BinaryIO,
                 quota: int | None = None, size_hint: int | None = None) -> StoredFile:
        """Store an upload (bytes, or a binary file read a piece at a time) in pieces.

        With a `quota`, the tenant's live uploads plus this one must stay
        within it (FileQuotaExceeded, nothing stored): checked before a piece
        is written when `size_hint` says the size, as the pieces come, and in
        the transaction that makes the file visible (so two uploads at once
        cannot both pass it). The pieces are written in transactions of their
        own, so no write lock is held for the length of an upload.
        """
        file_id, created = new_file_id(), self.clock()
        used = self.stored_bytes(tenant) if quota is not None else 0
        if quota is not None and size_hint is not None and used + size_hint > quota:
            raise FileQuotaExceeded(tenant, used, size_hint, quota)
        self._sweep_stopped_uploads(created)
        size = 0
        try:
            for seq, piece in enumerate(pieces(content)):
                size += len(piece)
                if quota is not None and used + size > quota:
                    raise FileQuotaExceeded(tenant, used, size, quota)
                with self.db.write() as conn:
                    conn.execute(file_chunks.insert().values(file_id=file_id, seq=seq, data=piece,
                                                             created_at=created))
            f = StoredFile(file_id, tenant, purpose, filename, size, created)
            with self.db.write() as conn:
                if quota is not None:
                    used = self._stored_bytes(conn, tenant, lock=True)
                    if used + size > quota:
                        raise FileQuotaExceeded(tenant, used, size, quota)
                conn.execute(files.insert().values(
                    id=f.id, tenant=tenant, purpose=purpose, filename=filename, bytes=f.bytes,
                    created_at=f.created_at, errors=0,
                ))
        except BaseException:
            with self.db.write() as conn:
                conn.execute(delete(file_chunks).where(file_chunks.c.file_id == file_id))
            raise
        return f

    def stored_bytes(self, tenant: str) -> int:
        """What the tenant's live uploads and its batches not yet reclaimed hold, in bytes (what its
        quota counts)."""
        with self.db.read() as conn:
            return self._stored_bytes(conn, tenant, lock=False)

    def _stored_bytes(self, conn, tenant: str, lock: bool) -> int:
        if lock and self.db.dialect == "postgresql":  # one quota check at a time per tenant
            conn.execute(select(func.pg_advisory_xact_lock(727002, func.hashtext(tenant))))
        uploads = conn.execute(select(func.coalesce(func.sum(files.c.bytes), 0)).where(
            files.c.tenant == tenant, files.c.deleted_at.is_(None), files.c.job_id.is_(None))).scalar_one()
        held = conn.execute(select(func.coalesce(func.sum(batches.c.stored_bytes), 0)).where(
            batches.c.tenant == tenant, batches.c.reclaimed_at.is_(None))).scalar_one()
        return int(uploads) + int(held)

    def _sweep_stopped_uploads(self, now: float) -> None:
        """Delete the pieces of uploads stopped midway (a server killed) an hour ago or more."""
        stale = (file_chunks.c.created_at < now - STOPPED_UPLOAD_S) & file_chunks.c.file_id.not_in(
            select(files.c.id))
        with self.db.read() as conn:
            if conn.execute(select(file_chunks.c.file_id).where(stale).limit(1)).first() is None:
                return
        with self.db.write() as conn:
            conn.execute(delete(file_chunks).where(stale))

    def get_file(self, tenant: str, file_id: str) -> StoredFile | None:
        with self.db.read() as conn:
            row = conn.execute(select(*FILE_COLUMNS).where(*_live_file(tenant, file_id))).first()
        return None if row is None else _file(row)

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        """An upload's bytes (None for an output file, which is rendered from results)."""
        parts = self.iter_content(tenant, file_id)
        return None if parts is None else b"".join(parts)

    def iter_content(self, tenant: str, file_id: str) -> Iterator[bytes] | None:
        """An upload's bytes a piece at a time, each read in a short transaction of its own (None for
        no such upload)."""
        with self.db.read() as conn:
            live = conn.execute(select(files.c.job_id).where(*_live_file(tenant, file_id))).first()
        if live is None or live.job_id is not None:
            return None
        return self._pieces(file_id)

    def _pieces(self, file_id: str) -> Iterator[bytes]:
        seq = 0
        while True:
            with self.db.read() as conn:
                piece = chunk_at(conn, file_id, seq)
            if piece is None:
                return
            yield piece
            seq += 1

    def list_files(self, tenant: str, purpose: str | None = None, limit: int = 10_000,
                   after: str | None = None, newest_first: bool = True) -> list[StoredFile]:
        """The tenant's live files, newest (or oldest) first; `after` a file id: those past it."""
        query = select(*FILE_COLUMNS).where(files.c.tenant == tenant, files.c.deleted_at.is_(None))
        if purpose is not None:
            query = query.where(files.c.purpose == purpose)
        with self.db.read() as conn:
            if after is not None:
                mark = conn.execute(select(files.c.created_at).where(*_live_file(tenant, after))).scalar()
                if mark is None:
                    return []
                if newest_first:
                    query = query.where(or_(files.c.created_at < mark,
                                            and_(files.c.created_at == mark, files.c.id > after)))
                else:
                    query = query.where(or_(files.c.created_at > mark,
                                            and_(files.c.created_at == mark, files.c.id < after)))
            # one order and its exact reverse (ties of created_at by id)
            order = (files.c.created_at.desc(), files.c.id) if newest_first else \
                (files.c.created_at.asc(), files.c.id.desc())
            rows = conn.execute(query.order_by(*order).limit(limit)).all()
        return [_file(row) for row in rows]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Forget a file; its pieces go at once and their space back to the file system (SQLite) or to
        the table's next writes (PostgreSQL). False when the tenant has no such file."""
        with self.db.write() as conn:
            found = conn.execute(update(files).where(*_live_file(tenant, file_id))
                                 .values(deleted_at=self.clock())).rowcount > 0
            if found:
                conn.execute(delete(file_chunks).where(file_chunks.c.file_id == file_id))
        if found:
            self.db.reclaim_space()
        return found

    # -- batches ------------------------------------------------------------------------------

    def add_batch(self, record: BatchRecord, quota: int | None = None) -> None:
        with self.db.write() as conn:
            if quota is not None:
                used = self._stored_bytes(conn, record.tenant, lock=True)
                if used + record.stored_bytes > quota:
                    raise FileQuotaExceeded(record.tenant, used, record.stored_bytes, quota, "batch")
            seq = conn.execute(select(func.coalesce(func.max(batches.c.seq), 0))).scalar_one() + 1
            conn.execute(batches.insert().values(
                id=record.id, seq=seq, tenant=record.tenant, job_id=record.job_id, endpoint=record.endpoint,
                input_file_id=record.input_file_id, completion_window=record.completion_window,
                metadata=record.metadata, created_at=record.created_at, errors=record.errors,
                failed_at=record.failed_at, stored_bytes=record.stored_bytes,
            ))

    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        with self.db.read() as conn:
            row = conn.execute(
                select(batches).where(batches.c.tenant == tenant, batches.c.id == batch_id)
            ).first()
        return None if row is None else _batch(row)

    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        """The tenant's batches, newest first; `after` a batch id: those created before it."""
        query = select(batches).where(batches.c.tenant == tenant)
        with self.db.read() as conn:
            if after is not None:
                seq = conn.execute(
                    select(batches.c.seq).where(batches.c.tenant == tenant, batches.c.id == after)
                ).scalar()
                if seq is None:
                    return []
                query = query.where(batches.c.seq < seq)
            rows = conn.execute(query.order_by(batches.c.seq.desc()).limit(limit)).all()
        return [_batch(row) for row in rows]

    def batch_of_job(self, tenant: str, job_id: int) -> BatchRecord | None:
        with self.db.read() as conn:
            row = conn.execute(
                select(batches).where(batches.c.tenant == tenant, batches.c.job_id == job_id)
            ).first()
        return None if row is None else _batch(row)

    def unfinished_batches(self, created_before: float) -> list[BatchRecord]:
        """Batches created before this time whose jobs are queued or running, oldest first."""
        query = (select(batches).join(jobs, jobs.c.id == batches.c.job_id)
                 .where(batches.c.created_at < created_before, jobs.c.state.in_(RUNNING_JOB_STATES))
                 .order_by(batches.c.seq))
        with self.db.read() as conn:
            return [_batch(row) for row in conn.execute(query).all()]

    def mark_expired(self, batch_id: str, at: float) -> None:
        """Record that the batch's window ran out (once: a second call keeps the first time)."""
        with self.db.write() as conn:
            conn.execute(update(batches).where(batches.c.id == batch_id, batches.c.expired_at.is_(None))
                         .values(expired_at=at))

    def attach_outputs(self, record: BatchRecord, sizes: tuple[int, int]) -> BatchRecord:
        """Give a finished batch its output and error files (once: a second caller reads the first's)."""
        out = StoredFile(new_file_id(), record.tenant, OUTPUT_PURPOSE, f"{record.id}_output.jsonl",
                         sizes[0], self.clock(), record.job_id, False)
        err = StoredFile(new_file_id(), record.tenant, OUTPUT_PURPOSE, f"{record.id}_error.jsonl",
                         sizes[1], self.clock(), record.job_id, True)
        with self.db.write() as conn:
            current = conn.execute(select(batches.c.output_file_id).where(batches.c.id == record.id)).scalar()
            if current is None:
                conn.execute(files.insert(), [_file_row(f) for f in (out, err)])
                conn.execute(update(batches).where(batches.c.id == record.id)
                             .values(output_file_id=out.id, error_file_id=err.id,
                                     stored_bytes=batches.c.stored_bytes + sizes[0] + sizes[1]))
            row = conn.execute(select(batches).where(batches.c.id == record.id)).first()
        return _batch(row)

    # -- reclaiming ended batches' rows -------------------------------------------------------

    def reclaim_batches(self, ended_before: float, limit: int = 100) -> list[BatchRecord]:
        """Mark up to `limit` batches ended before `ended_before` reclaimed (one short transaction),
        then delete their jobs' request rows a piece a transaction: no write lock is held longer than
        one piece takes. Batches marked by a call that stopped midway are finished first."""
        left = (select(requests.c.id).where(requests.c.job_id == batches.c.job_id).limit(1)).exists()
        with self.db.read() as conn:
            unfinished = [row.id for row in conn.execute(
                select(batches.c.id).where(batches.c.reclaimed_at.is_not(None), left)
                .order_by(batches.c.seq).limit(limit)).all()]
            due = [row.id for row in conn.execute(
                select(batches.c.id).join(jobs, jobs.c.id == batches.c.job_id)
                .where(batches.c.reclaimed_at.is_(None), jobs.c.state.in_(ENDED_JOB_STATES),
                       jobs.c.finished_at < ended_before)
                .order_by(jobs.c.finished_at, batches.c.seq).limit(max(0, limit - len(unfinished)))).all()]
        if due:
            with self.db.write() as conn:
                conn.execute(update(batches).where(batches.c.id.in_(due), batches.c.reclaimed_at.is_(None))
                             .values(reclaimed_at=self.clock()))
        ids = unfinished + due
        if not ids:
            return []
        with self.db.read() as conn:
            rows = conn.execute(select(batches).where(batches.c.id.in_(ids)).order_by(batches.c.seq)).all()
        deleted = sum(self._delete_rows(row.job_id) for row in rows)
        if deleted:
            self.db.reclaim_space(vacuum_tables=("requests", "request_logprobs"))
        return [_batch(row) for row in rows]

    def discard_job_rows(self, job_id: int) -> int:
        with self.db.read() as conn:
            state = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
        if state not in ENDED_JOB_STATES:
            return 0
        deleted = self._delete_rows(job_id)
        if deleted:
            self.db.reclaim_space(vacuum_tables=("requests", "request_logprobs"))
        return deleted

    def _delete_rows(self, job_id: int) -> int:
        """Delete the job's request rows and their logprobs pieces, RECLAIM_PIECE_ROWS a transaction."""
        deleted = 0
        while True:
            with self.db.write() as conn:
                ids = list(conn.execute(select(requests.c.id).where(requests.c.job_id == job_id)
                                        .limit(RECLAIM_PIECE_ROWS)).scalars())
                if not ids:
                    return deleted
                conn.execute(delete(request_logprobs).where(request_logprobs.c.request_id.in_(ids)))
                conn.execute(delete(requests).where(requests.c.id.in_(ids)))
            deleted += len(ids)


def _live_file(tenant: str, file_id: str) -> Iterable:
    return (files.c.tenant == tenant, files.c.id == file_id, files.c.deleted_at.is_(None))


def _file_row(f: StoredFile) -> dict:
    return {"id": f.id, "tenant": f.tenant, "purpose": f.purpose, "filename": f.filename, "bytes": f.bytes,
            "created_at": f.created_at, "job_id": f.job_id, "errors": int(f.errors)}


def _file(row) -> StoredFile:
    return StoredFile(row.id, row.tenant, row.purpose, row.filename, row.bytes, row.created_at, row.job_id,
                      bool(row.errors))


def _batch(row) -> BatchRecord:
    return BatchRecord(
        id=row.id, tenant=row.tenant, job_id=row.job_id, endpoint=row.endpoint,
        input_file_id=row.input_file_id, completion_window=row.completion_window,
        metadata=row._mapping["metadata"], created_at=row.created_at, errors=row.errors,
        failed_at=row.failed_at, output_file_id=row.output_file_id, error_file_id=row.error_file_id,
        expired_at=row.expired_at, stored_bytes=row.stored_bytes, reclaimed_at=row.reclaimed_at,
    )
