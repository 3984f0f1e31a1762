"""A tenant's stored files and batches, as the job table keeps them (the Batch API's records).

A batch is a job of class batch, run within its completion window. What the
records read as in OpenAI's JSON is `core/openai/batch.py`'s. Pure: no I/O.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600.0
_WINDOW = re.compile(r"([1-9][0-9]{0,5})([smh])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
BATCH_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"


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
