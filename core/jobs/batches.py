"""A tenant's stored files and batches, as the job table keeps them (the Batch API's records).

A batch is a job of class batch, run within its completion window. What the
records read as in OpenAI's JSON is `core/openai/batch.py`'s. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from fsched.core.types import RequestSpec

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
    # What its rows hold, as its tenant's file quota counts it: its requests' rows (charged when it is
    # created), then its output and error files' bytes too (once it ended and they were made).
    stored_bytes: int = 0
    reclaimed_at: float | None = None  # its rows (requests, outputs, logprobs) were deleted then

    @property
    def expires_at(self) -> float:
        return self.created_at + window_seconds(self.completion_window)


# What a request row holds besides its request's own text: the sampling parameters' JSON, the other
# columns and the row's index entries. Measured: a 40-byte prompt's row grew an SQLite file by about
# 380 bytes and PostgreSQL's requests table by about 600.
ROW_OVERHEAD_BYTES = 600


def stored_bytes_of(requests: Sequence[RequestSpec]) -> int:
    """What a batch's request rows hold, as its tenant's quota charges them: each row's text as stored
    (its prompt or messages, tools and answer options as JSON, its custom_id, in UTF-8) and
    ROW_OVERHEAD_BYTES. A line of n choices is n rows and is charged n times, as it is stored n times;
    the JSON of a value the choices share is made once."""
    sizes: dict[int, int] = {}

    def size_of(value, make) -> int:
        key = id(value)
        if key not in sizes:
            sizes[key] = _utf8_len(make(value))
        return sizes[key]

    total = 0
    for spec in requests:
        total += ROW_OVERHEAD_BYTES + _utf8_len(spec.custom_id)
        if spec.prompt is not None:
            total += size_of(spec.prompt, str)
        if spec.messages:
            total += size_of(spec.messages, lambda ms: _json([m.to_json() for m in ms]))
        total += size_of(spec.render, lambda r: "" if r.to_json() is None else _json(r.to_json()))
        total += size_of(spec.answer, lambda a: _json(a.to_json()) if a.to_json() else "")
    return total


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


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
