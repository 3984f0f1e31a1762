"""MemoryFileStore: the FileStore contract in memory: the Batch API's files and batches, per tenant.

An upload is read a piece at a time (outside the lock: a slow reader holds
no other call up) and made visible in one call that checks the quota again,
as the SQL store's last transaction does; what it refuses leaves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import BinaryIO

from fsched.core.jobs.batches import OUTPUT_PURPOSE, BatchRecord, StoredFile, new_file_id
from fsched.core.ports.files import pieces
from fsched.core.ports.memory.rows import MemoryBatch, MemoryFile, MemoryRows, atomic
from fsched.core.ports.records import FileQuotaExceeded
from fsched.core.types import JobState

RUNNING_JOB_STATES = (JobState.QUEUED, JobState.IN_PROGRESS)  # not ended, nor cancelling
RECLAIM_PIECE_ROWS = 500  # request rows a reclaim deletes in one call holding the lock


class MemoryFileStore:
    def __init__(self, rows: MemoryRows):
        self.rows = rows

    # -- files ----------------------------------------------------------------------------------

    def add_file(self, tenant: str, purpose: str, filename: str, content: bytes | BinaryIO,
                 quota: int | None = None, size_hint: int | None = None) -> StoredFile:
        used = self.stored_bytes(tenant) if quota is not None else 0
        if quota is not None and size_hint is not None and used + size_hint > quota:
            raise FileQuotaExceeded(tenant, used, size_hint, quota)
        read, size = [], 0
        for piece in pieces(content):
            size += len(piece)
            if quota is not None and used + size > quota:
                raise FileQuotaExceeded(tenant, used, size, quota)
            read.append(piece)
        return self._store(tenant, purpose, filename, tuple(read), size, quota)

    @atomic
    def _store(self, tenant: str, purpose: str, filename: str, read: tuple[bytes, ...], size: int,
               quota: int | None) -> StoredFile:
        if quota is not None:
            used = self._stored_bytes(tenant)
            if used + size > quota:
                raise FileQuotaExceeded(tenant, used, size, quota)
        f = StoredFile(new_file_id(), tenant, purpose, filename, size, self.rows.clock())
        self.rows.files[f.id] = MemoryFile(f, read)
        return f

    @atomic
    def stored_bytes(self, tenant: str) -> int:
        return self._stored_bytes(tenant)

    def _stored_bytes(self, tenant: str) -> int:
        uploads = sum(f.record.bytes for f in self._live(tenant) if f.record.job_id is None)
        return uploads + sum(b.record.stored_bytes for b in self.rows.batches.values()
                             if b.record.tenant == tenant and b.record.reclaimed_at is None)

    def _live(self, tenant: str) -> list[MemoryFile]:
        return [f for f in self.rows.files.values() if f.record.tenant == tenant and f.deleted_at is None]

    def _live_file(self, tenant: str, file_id: str) -> MemoryFile | None:
        f = self.rows.files.get(file_id)
        return f if f is not None and f.record.tenant == tenant and f.deleted_at is None else None

    @atomic
    def get_file(self, tenant: str, file_id: str) -> StoredFile | None:
        f = self._live_file(tenant, file_id)
        return None if f is None else f.record

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        parts = self.iter_content(tenant, file_id)
        return None if parts is None else b"".join(parts)

    @atomic
    def iter_content(self, tenant: str, file_id: str) -> Iterator[bytes] | None:
        f = self._live_file(tenant, file_id)
        if f is None or f.record.job_id is not None:
            return None
        return iter(f.pieces)

    @atomic
    def list_files(self, tenant: str, purpose: str | None = None, limit: int = 10_000,
                   after: str | None = None, newest_first: bool = True) -> list[StoredFile]:
        """Newest first by creation time (ties by id), or its exact reverse; `after` a file id of the
        tenant's: those past it in that order."""
        live = [f.record for f in self._live(tenant) if purpose is None or f.record.purpose == purpose]
        live.sort(key=_newest_first)
        if not newest_first:
            live.reverse()
        if after is not None:
            mark = self._live_file(tenant, after)
            if mark is None:
                return []
            past = _newest_first(mark.record)
            live = [f for f in live if (_newest_first(f) > past if newest_first else _newest_first(f) < past)]
        return live[:limit]

    @atomic
    def delete_file(self, tenant: str, file_id: str) -> bool:
        f = self._live_file(tenant, file_id)
        if f is None:
            return False
        f.deleted_at, f.pieces = self.rows.clock(), ()
        return True

    # -- batches ----------------------------------------------------------------------------------

    @atomic
    def add_batch(self, record: BatchRecord, quota: int | None = None) -> None:
        if quota is not None:
            used = self._stored_bytes(record.tenant)
            if used + record.stored_bytes > quota:
                raise FileQuotaExceeded(record.tenant, used, record.stored_bytes, quota, "batch")
        self.rows.batches[record.id] = MemoryBatch(record, self.rows.next_batch_seq())

    @atomic
    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        b = self.rows.batches.get(batch_id)
        return b.record if b is not None and b.record.tenant == tenant else None

    @atomic
    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        mine = sorted((b for b in self.rows.batches.values() if b.record.tenant == tenant),
                      key=lambda b: -b.seq)
        if after is not None:
            mark = self.rows.batches.get(after)
            if mark is None or mark.record.tenant != tenant:
                return []
            mine = [b for b in mine if b.seq < mark.seq]
        return [b.record for b in mine[:limit]]

    @atomic
    def batch_of_job(self, tenant: str, job_id: int) -> BatchRecord | None:
        return next((b.record for b in self.rows.batches.values()
                     if b.record.tenant == tenant and b.record.job_id == job_id), None)

    @atomic
    def unfinished_batches(self, created_before: float) -> list[BatchRecord]:
        due = [b for b in self.rows.batches.values()
               if b.record.created_at < created_before and b.record.job_id in self.rows.jobs
               and self.rows.jobs[b.record.job_id].state in RUNNING_JOB_STATES]
        return [b.record for b in sorted(due, key=lambda b: b.seq)]

    @atomic
    def mark_expired(self, batch_id: str, at: float) -> None:
        b = self.rows.batches.get(batch_id)
        if b is not None and b.record.expired_at is None:
            b.record = replace(b.record, expired_at=at)

    @atomic
    def attach_outputs(self, record: BatchRecord, sizes: tuple[int, int]) -> BatchRecord:
        b = self.rows.batches[record.id]
        if b.record.output_file_id is None:
            now = self.rows.clock()
            out, err = (StoredFile(new_file_id(), record.tenant, OUTPUT_PURPOSE, f"{record.id}_{kind}.jsonl",
                                   size, now, record.job_id, errors)
                        for kind, size, errors in (("output", sizes[0], False), ("error", sizes[1], True)))
            self.rows.files[out.id], self.rows.files[err.id] = MemoryFile(out), MemoryFile(err)
            b.record = replace(b.record, output_file_id=out.id, error_file_id=err.id,
                               stored_bytes=b.record.stored_bytes + sizes[0] + sizes[1])
        return b.record

    # -- reclaiming ended batches' rows -----------------------------------------------------------

    def reclaim_batches(self, ended_before: float, limit: int = 100) -> list[BatchRecord]:
        marked = self._mark_reclaimed(ended_before, limit)
        for b in marked:
            self._delete_rows(b.job_id)
        return [self.rows.batches[b.id].record for b in marked]

    @atomic
    def _mark_reclaimed(self, ended_before: float, limit: int) -> list[BatchRecord]:
        jobs = self.rows.jobs
        unfinished = [b for b in self.rows.batches.values()
                      if b.record.reclaimed_at is not None and b.record.job_id in jobs
                      and jobs[b.record.job_id].request_ids]
        due = [b for b in self.rows.batches.values()
               if b.record.reclaimed_at is None and b.record.job_id in jobs
               and jobs[b.record.job_id].state.finished and jobs[b.record.job_id].finished_at < ended_before]
        due.sort(key=lambda b: (jobs[b.record.job_id].finished_at, b.seq))
        chosen = sorted(unfinished, key=lambda b: b.seq)[:limit]
        now = self.rows.clock()
        for b in due[:max(0, limit - len(chosen))]:
            b.record = replace(b.record, reclaimed_at=now)
            chosen.append(b)
        return [b.record for b in sorted(chosen, key=lambda b: b.seq)]

    def discard_job_rows(self, job_id: int) -> int:
        with self.rows.lock:
            job = self.rows.jobs.get(job_id)
            if job is None or not job.state.finished:
                return 0
        return self._delete_rows(job_id)

    def _delete_rows(self, job_id: int) -> int:
        deleted = 0
        while True:
            with self.rows.lock:  # a piece a hold of the lock, as the SQL store's a transaction
                job = self.rows.jobs[job_id]
                piece = job.request_ids[:RECLAIM_PIECE_ROWS]
                job.request_ids = job.request_ids[RECLAIM_PIECE_ROWS:]
                if not piece:
                    return deleted
                for key in piece:
                    del self.rows.requests[key]
                job.num_reclaimed += len(piece)
            deleted += len(piece)


def _newest_first(f: StoredFile) -> tuple[float, str]:
    """The key that lists files newest first: creation time going down, ties by id going up."""
    return -f.created_at, f.id
