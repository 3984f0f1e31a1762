"""The Batch API's files and batches in the job table, always read and written per tenant.

Every read names the tenant, so one tenant's id never finds another's file or
batch: the server answers both "unknown" and "not yours" alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import and_, func, or_, select, update

from fsched.core.jobs.batches import OUTPUT_PURPOSE, BatchRecord, StoredFile, new_file_id
from fsched.core.types import JobState
from fsched.storage.db import Database
from fsched.storage.models import BatchRow, FileRow, Job
from fsched.storage.schema import ensure_schema

files = FileRow.__table__
batches = BatchRow.__table__
jobs = Job.__table__
RUNNING_JOB_STATES = [JobState.QUEUED.value, JobState.IN_PROGRESS.value]  # not ended, nor cancelling
FILE_COLUMNS = (files.c.id, files.c.tenant, files.c.purpose, files.c.filename, files.c.bytes,
                files.c.created_at, files.c.job_id, files.c.errors)


class SqlFileStore:
    def __init__(self, db: Database, clock=time.time):
        self.db = db
        self.clock = clock
        ensure_schema(self.db)

    # -- files --------------------------------------------------------------------------------

    def add_file(self, tenant: str, purpose: str, filename: str, content: bytes) -> StoredFile:
        f = StoredFile(new_file_id(), tenant, purpose, filename, len(content), self.clock())
        with self.db.write() as conn:
            conn.execute(files.insert().values(
                id=f.id, tenant=tenant, purpose=purpose, filename=filename, bytes=f.bytes,
                created_at=f.created_at, content=content, errors=0,
            ))
        return f

    def get_file(self, tenant: str, file_id: str) -> StoredFile | None:
        with self.db.read() as conn:
            row = conn.execute(select(*FILE_COLUMNS).where(*_live_file(tenant, file_id))).first()
        return None if row is None else _file(row)

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        """An upload's bytes (None for an output file, which is rendered from results)."""
        with self.db.read() as conn:
            return conn.execute(select(files.c.content).where(*_live_file(tenant, file_id))).scalar()

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
        """Forget a file (its content goes at once); False when the tenant has no such file."""
        with self.db.write() as conn:
            return conn.execute(
                update(files).where(*_live_file(tenant, file_id))
                .values(deleted_at=self.clock(), content=None)
            ).rowcount > 0

    # -- batches ------------------------------------------------------------------------------

    def add_batch(self, record: BatchRecord) -> None:
        with self.db.write() as conn:
            seq = conn.execute(select(func.coalesce(func.max(batches.c.seq), 0))).scalar_one() + 1
            conn.execute(batches.insert().values(
                id=record.id, seq=seq, tenant=record.tenant, job_id=record.job_id, endpoint=record.endpoint,
                input_file_id=record.input_file_id, completion_window=record.completion_window,
                metadata=record.metadata, created_at=record.created_at, errors=record.errors,
                failed_at=record.failed_at,
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
                             .values(output_file_id=out.id, error_file_id=err.id))
            row = conn.execute(select(batches).where(batches.c.id == record.id)).first()
        return _batch(row)


def _live_file(tenant: str, file_id: str) -> Iterable:
    return (files.c.tenant == tenant, files.c.id == file_id, files.c.deleted_at.is_(None))


def _file_row(f: StoredFile) -> dict:
    return {"id": f.id, "tenant": f.tenant, "purpose": f.purpose, "filename": f.filename, "bytes": f.bytes,
            "created_at": f.created_at, "content": None, "job_id": f.job_id, "errors": int(f.errors)}


def _file(row) -> StoredFile:
    return StoredFile(row.id, row.tenant, row.purpose, row.filename, row.bytes, row.created_at, row.job_id,
                      bool(row.errors))


def _batch(row) -> BatchRecord:
    return BatchRecord(
        id=row.id, tenant=row.tenant, job_id=row.job_id, endpoint=row.endpoint,
        input_file_id=row.input_file_id, completion_window=row.completion_window,
        metadata=row._mapping["metadata"], created_at=row.created_at, errors=row.errors,
        failed_at=row.failed_at, output_file_id=row.output_file_id, error_file_id=row.error_file_id,
        expired_at=row.expired_at,
    )
