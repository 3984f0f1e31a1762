"""api/online.py's `relayed`: what a streamed request's generator yields, piece by piece (each piece is one
write to the client): its opening, each update while it runs, and its last update's events together
with its ending."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from fsched.api.online import relayed
from fsched.api.sse import LastPiece
from fsched.core.ports.records import RequestProgress
from fsched.core.types import RequestStatus


class _Events:
    trailer = "T"

    def opening(self):
        return ["O"]

    def update(self, choices):
        return [f"U{p.output_text}" + ("F" if p.status.is_finished else "") for p in choices]

    def closing(self, final):
        return ["C"]

    def error(self, status, message, code):
        return f"E{status}"


def _progress(text: str, status: RequestStatus) -> tuple:
    return (RequestProgress("r1", 1, status, text, len(text), 0.0, 0.0, None, None),)


class _Updates:
    """A stream's progress: `updates` in turn, then run out; whether it was asked past its end."""

    def __init__(self, updates):
        self.updates = list(updates)
        self.ran_out = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.updates:
            self.ran_out = True
            raise StopAsyncIteration
        return self.updates.pop(0)


def _relayed(progress) -> list[str]:
    state = SimpleNamespace(metrics=None)

    async def run():
        return [piece async for piece in relayed(None, state, 1, None, progress, _Events())]

    return asyncio.run(run())


def test_the_last_update_goes_out_with_the_ending_in_one_piece_once_the_progress_has_run_out():
    running, ended = _progress("a", RequestStatus.RUNNING), _progress("ab", RequestStatus.FINISHED_LENGTH)
    progress = _Updates([running, ended])
    pieces = _relayed(progress)
    assert pieces == ["O", "Ua", "UabFCT"]
    assert type(pieces[-1]) is LastPiece
    assert progress.ran_out  # its watch (the hub's) ended by itself, as it does after an end


def test_a_one_token_answer_is_its_opening_and_one_last_piece():
    pieces = _relayed(_Updates([_progress("a", RequestStatus.FINISHED_STOPPED)]))
    assert pieces == ["O", "UaFCT"] and type(pieces[-1]) is LastPiece


def test_progress_that_runs_out_before_an_end_still_closes_with_the_ending():
    # (the hub's watch ends only after an end; a progress that stops short still gets the stream's
    # ending, and its unfinished request is cancelled)
    cancelled = []

    async def cancel_job(job_id):
        cancelled.append(job_id)

    state = SimpleNamespace(metrics=None, backend=SimpleNamespace(jobs=SimpleNamespace(cancel_job=None)),
                            link=None)
    state.call = lambda fn, job_id: cancel_job(job_id)

    progress = _Updates([_progress("a", RequestStatus.RUNNING)])

    async def run():
        return [p async for p in relayed(None, state, 7, None, progress, _Events())]

    pieces = asyncio.run(run())
    assert pieces[:2] == ["O", "Ua"] and cancelled == [7]
