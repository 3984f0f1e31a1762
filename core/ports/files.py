"""FileStore: the Batch API's files and batches in the job table, always per tenant.

What every implementation must hold:

1. **A tenant sees only its own.** Every read names the tenant; another
   tenant's file or batch id finds nothing, exactly as an unknown id does
   (the server answers both alike, so ids reveal nothing).
2. **Uploads keep their bytes; outputs are rendered.** An uploaded file's
   content is stored exactly (in pieces, written and read a piece at a time);
   an output file has none (it is rendered from its job's results), and a
   deleted file's content is gone at once, its space given back.
3. **A quota holds.** What a tenant stores is its live uploads and what its
   batches not yet reclaimed hold (`BatchRecord.stored_bytes`: their request
   rows from creation, their output files once attached). An upload, or a
   batch added with a quota, that would take it over the quota it is given
   stores nothing.
4. **Outputs are attached once.** The first `attach_outputs` of a batch
   gives it its output and error files; a later caller reads the first's.
5. **Newest first, by creation order.** Listings of files and batches go
   newest first (files may go oldest first); `after` pages them by an id.
6. **Short transactions.** Each call is one transaction (an upload: one a piece, and one
   that makes the file visible; a reclaim: one a bounded piece of rows).
7. **Reclaimed batches keep their record.** Reclaiming an ended batch deletes
   its job's request rows (their outputs and logprobs with them) and marks
   it reclaimed: it still reads as before (its job keeps its counts), it no
   longer counts toward the quota, and its output files have no content.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, Protocol, runtime_checkable

from fsched.core.jobs.batches import BatchRecord, StoredFile

# An upload is stored and read back in pieces of this size: neither the server nor the table then
# holds a whole file in one value.
PIECE_BYTES = 1024 * 1024


def pieces(content: bytes | bytearray | memoryview | BinaryIO, size: int = PIECE_BYTES) -> Iterator[bytes]:
    """Bytes', or a binary file's, content in pieces of `size` bytes (the last one shorter)."""
    if isinstance(content, bytes | bytearray | memoryview):
        view = memoryview(content)
        for at in range(0, len(view), size):
            yield bytes(view[at:at + size])
        return
    while piece := content.read(size):
        yield piece


@runtime_checkable
class FileStore(Protocol):
    def add_file(self, tenant: str, purpose: str, filename: str, content: bytes | BinaryIO,
                 quota: int | None = None, size_hint: int | None = None) -> StoredFile:
        """Store an upload of `tenant` (bytes, or a binary file read a piece at a time); its record,
        with a new id. With a `quota`: FileQuotaExceeded, nothing stored, when the tenant's live uploads
        and this one would hold more bytes (`size_hint`, when known, lets it refuse before reading)."""
        ...

    def stored_bytes(self, tenant: str) -> int:
        """The bytes the tenant's live uploads and its batches not yet reclaimed hold (what its quota
        counts)."""
        ...

    def get_file(self, tenant: str, file_id: str) -> StoredFile | None:
        """The tenant's live (not deleted) file with this id; None otherwise."""
        ...

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        """An upload's bytes; None for an output file, a deleted one, or another tenant's."""
        ...

    def iter_content(self, tenant: str, file_id: str) -> Iterator[bytes] | None:
        """An upload's bytes a piece at a time (never the whole file in memory); None as file_content."""
        ...

    def list_files(self, tenant: str, purpose: str | None = None, limit: int = 10_000,
                   after: str | None = None, newest_first: bool = True) -> list[StoredFile]:
        """The tenant's live files (of one purpose, if given), newest first (or oldest first); with
        `after` (a file id of the tenant's), those that come after it in that order."""
        ...

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Forget a file and its content; False when the tenant has no such file."""
        ...

    def add_batch(self, record: BatchRecord, quota: int | None = None) -> None:
        """Store a new batch. With a `quota`: FileQuotaExceeded (what="batch"), nothing stored, when
        the tenant's stored bytes and the batch's `stored_bytes` would pass it (checked as uploads are,
        one check at a time per tenant)."""
        ...

    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """The tenant's batch with this id; None otherwise."""
        ...

    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        """The tenant's batches, newest first; with `after` (a batch id), those created before it."""
        ...

    def batch_of_job(self, tenant: str, job_id: int) -> BatchRecord | None:
        """The tenant's batch that runs this job; None otherwise."""
        ...

    def unfinished_batches(self, created_before: float) -> list[BatchRecord]:
        """Every tenant's batches created before `created_before` whose jobs are queued or running
        (not ended, nor being cancelled), oldest first: what the completion-window sweep reads."""
        ...

    def mark_expired(self, batch_id: str, at: float) -> None:
        """Record that the batch's completion window ran out at `at`; a later call changes nothing."""
        ...

    def attach_outputs(self, record: BatchRecord, sizes: tuple[int, int]) -> BatchRecord:
        """Give a finished batch its output and error files (of these sizes, which its stored bytes
        then count too), once; the batch after."""
        ...

    def reclaim_batches(self, ended_before: float, limit: int = 100) -> list[BatchRecord]:
        """Reclaim up to `limit` batches whose jobs ended (completed, failed or cancelled: an expired
        batch's is cancelled) before `ended_before`, oldest first: each marked reclaimed, then its
        job's request rows deleted a bounded piece a transaction. A batch marked before whose rows a
        stopped call left is finished too. The batches reclaimed, as they read now."""
        ...

    def discard_job_rows(self, job_id: int) -> int:
        """Delete an ended job's request rows a bounded piece a transaction (a batch refused after its
        job was stored); the rows deleted (0 while the job has not ended)."""
        ...
