"""Per-stage timestamps of an online request's way to its first token, for benchmarks.

Off unless the process starts with `FSCHED_STAMPS` naming a folder: then
each process appends lines `stage job_id wall_time` to its own file there
(`<pid>.txt`), and bench/online_path.py (`--stamps`) reads them back into
each stage's share of the first token's time. Off, a stamp costs one test.

The stages, in order: `arrived` (the server has the request's head),
`handler` (its handler starts), `grouped` (the group commit that stores it
begins its transaction), `committed` (that transaction ended), `stored` (its
handler resumed, its row in the table), `announced` (a daemon's link heard of
it: with a server's nudge, the claim asked for at the commit, often after
`claim_began`), `claim_began` (the daemon's transaction that claimed it began),
`claimed` (that claim is in, and the daemon takes it in), `opened`
and `sent` (its stream to the engine opened, its request written), `read`
(its first token read from the engine), `pushed` (its first text queued on
the daemon's link), `received` (the server read that push), `written` (the
server wrote its first chunk). A client that tags its request (the
`TAG_HEADER` header, a number of its own) gets a `tag` line whose time is
that number: bench/online_path.py joins its own times (`client_sent`,
`client_first`: its request sent, its first content read) to the job by it.
Its end's way back: `end_read` (the engine's
last token read), `finished` (the step that ends it), `end_pushed` (its end
pushed), `end_received`, `end_written` (the server wrote the stream's last
bytes).
"""

from __future__ import annotations

import atexit
import os
import time

ARRIVED = "fsched.arrived"  # a server's request scope: when its head was read (stamps on)
TAG_HEADER = "x-fsched-stamp-tag"  # a client's number for its request, stamped with the job (stamps on)

_file = None
if folder := os.environ.get("FSCHED_STAMPS"):
    _file = open(os.path.join(folder, f"{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115
    atexit.register(_file.close)


def enabled() -> bool:
    return _file is not None


def tag(job_id: int, value: str | None) -> None:
    """The client's tag of the request stored as `job_id` (a `tag` line; none when it sent no number)."""
    if _file is not None and _a_number(value):
        _file.write(f"tag {job_id} {value}\n")


def stamp_tagged(stage: str, value: str | None) -> None:
    """Note that the request a client tagged `value` reached `stage` now (a stage of the client's: the
    paced stand-in engine notes when a tagged request reached it, a direct client's way there)."""
    if _file is not None and _a_number(value):
        _file.write(f"{stage} {value} {time.time():.6f}\n")


def _a_number(value: str | None) -> bool:
    """Digits only (ASCII: a header's other digits would not read back as a number)."""
    return value is not None and value.isascii() and value.isdigit()


def stamp(stage: str, job_id: int, at: float | None = None) -> None:
    """Note that `job_id` reached `stage` now (or at `at`, a wall time)."""
    if _file is not None:
        _file.write(f"{stage} {job_id} {time.time() if at is None else at:.6f}\n")
