"""The Batch API's objects: stored files and batches, and the OpenAI JSON they read as.

A batch is a job of class batch; its OpenAI status follows the job's state,
its `request_counts` the job's counters. Pure: the records come in, dicts go out.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from fsched.core.jobs.jobstate import JobSummary
from fsched.core.jobs.values import BadValue, storable
from fsched.core.types import JobState

COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600.0
_WINDOW = re.compile(r"([1-9][0-9]{0,5})([smh])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
BATCH_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
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


@dataclass(slots=True, frozen=True)
class StoredFile:
    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    job_id: int | None = None  # an output file: the job whose results it renders
    errors: bool = False  # an output file: the failed and cancelled lines


@dataclass(slots=True, frozen=True)
class BatchRecord:
    id: str
    tenant: str
    job_id: int | None  # None: the input was refused, nothing runs
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict | None
    created_at: float
    errors: list | None = None
    failed_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    expired_at: float | None = None  # its window ran out with work unfinished (that was cancelled)

    @property
    def expires_at(self) -> float:
        return self.created_at + window_seconds(self.completion_window)


def window_seconds(window: str) -> float:
    """A completion window's length: OpenAI's "24h", or a shorter one ("30m", "90s"; fsched's).

    Raises ValueError for anything else."""
    match = _WINDOW.fullmatch(window)
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)] if match else 0.0
    if not 0 < seconds <= COMPLETION_WINDOW_S:
        raise ValueError(f"completion_window must be {COMPLETION_WINDOW!r} or shorter, as a number of "
                         "seconds, minutes or hours ('90s', '30m', '2h')")
    return seconds


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


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
        except BadValue as exc:  # no column (SQLite text, PostgreSQL jsonb) takes these
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
