"""The Batch API's objects in OpenAI's JSON: files, batches, their lists, and a batch's metadata.

A batch's OpenAI status follows its job's state, its `request_counts` the
job's counters. Pure: the records (`core/jobs/batches.py`) come in, dicts go out.
"""

from __future__ import annotations

from fsched.core.jobs.batches import BatchRecord, StoredFile
from fsched.core.jobs.inputs import InputError, storable
from fsched.core.jobs.jobstate import JobSummary
from fsched.core.types import JobState

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512

_JOB_STATUS = {
    JobState.QUEUED: "in_progress",  # validated when created; waiting for a daemon
    JobState.IN_PROGRESS: "in_progress",
    JobState.COMPLETED: "completed",
    JobState.FAILED: "completed",  # every line ended; the failed ones are in the error file
    JobState.CANCELLING: "cancelling",
    JobState.CANCELLED: "cancelled",
}


def file_object(f: StoredFile) -> dict:
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": int(f.created_at),
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": None,
    }


def list_page(data: list[dict], has_more: bool) -> dict:
    """OpenAI's page of a list (files, batches): the objects, the first and last ids, whether more
    follow."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def validate_metadata(metadata: object) -> dict | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 and values up to 512 characters."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ValueError("metadata must be an object of strings")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise ValueError(
                f"metadata keys are strings of at most {MAX_METADATA_KEY} characters, values strings "
                f"of at most {MAX_METADATA_VALUE}"
            )
        try:
            storable(key)
            storable(value)
        except InputError as exc:  # no column (SQLite text, PostgreSQL jsonb) takes these
            raise ValueError(f"metadata {exc.message}") from None
    return dict(metadata)


def batch_status(record: BatchRecord, job: JobSummary | None) -> str:
    if record.failed_at is not None or job is None:
        return "failed"
    if record.expired_at is not None:  # its unfinished work is being, or was, cancelled
        return "expired" if job.state.finished else "finalizing"
    return _JOB_STATUS[job.state]


def batch_object(record: BatchRecord, job: JobSummary | None) -> dict:
    """The OpenAI batch object of a record and its job (None when the input was refused)."""
    status = batch_status(record, job)
    counts = {"total": 0, "completed": 0, "failed": 0}
    if job is not None:
        c = job.counts
        counts = {"total": c.num_requests, "completed": c.num_done, "failed": c.num_failed + c.num_cancelled}
    finished = job.finished_at if job is not None else None
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": None if not record.errors else {"object": "list", "data": record.errors},
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": status,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": int(record.created_at),
        "in_progress_at": _int(job.started_at) if job is not None else None,
        "expires_at": int(record.expires_at),
        "finalizing_at": _int(finished) if status == "completed" else None,
        "completed_at": _int(finished) if status == "completed" else None,
        "failed_at": _int(record.failed_at),
        "expired_at": _int(record.expired_at) if status == "expired" else None,
        "cancelling_at": _int(finished) if status == "cancelled" else None,
        "cancelled_at": _int(finished) if status == "cancelled" else None,
        "request_counts": counts,
        "metadata": record.metadata,
    }


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
