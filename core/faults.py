"""Named crash points, for the chaos tests: `FSCHED_CRASH_AT=name[:n]` kills the process there.

A crash point marks a moment where a real crash (power loss, kill -9, OOM
killer) would be hardest to survive: just after a claim commits, just after
a token flush, inside a completion's or a submit's transaction before it
commits. With the variable unset (always, outside tests) `crash_point` is a
dictionary lookup and nothing else.

`name:n` crashes on the n-th time the point is reached (default 1), so a
test can crash deep into a run, not only at its first claim.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = (
    "after_claim",  # the claim transaction committed; nothing generated yet
    "after_flush",  # generated tokens committed; the step's state is only in memory
    "before_done_commit",  # a completion's output and state written, not committed
    "mid_submit",  # part of a job's requests inserted, not committed
)

_counts: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get("FSCHED_CRASH_AT")
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    if name not in CRASH_POINTS:
        raise ValueError(f"FSCHED_CRASH_AT names no crash point: {name!r} (known: {', '.join(CRASH_POINTS)})")
    return name, int(nth or 1)


def crash_point(name: str) -> None:
    """SIGKILL this process if FSCHED_CRASH_AT names this point and its count is reached."""
    target = _target()
    if target is None or target[0] != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
