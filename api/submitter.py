"""Online requests stored by group commit: one write transaction for the requests that arrive together.

Every online request is a row before it runs. Stored one transaction each,
requests that come together (a batch of streams ending in one engine step,
and their clients sending the next ones) queue for the table's write lock,
and the last waits for all the others: measured on SQLite with 8 streams,
submits waited up to 128 ms for the lock. Here the handlers hand their
submissions to one writer thread: while it stores one group, the next
gathers, and goes in one transaction (`CatalogStore.submit_each`) as soon as
that one is done. A request over its tenant's queue limit gets its own
QueueFull, one whose key was revoked its KeyRevoked; a group whose
transaction fails is stored again one by one, so that a failure is only its own.

The writer thread takes the next group itself, the moment a transaction
ends: it does not wait for the event loop to hear of the last one first.
When many requests come at once, the loop is busy reading and parsing them
for tens of milliseconds, and a writer driven from the loop started its
next transaction only after the loop had worked through them all (a burst
of 128 requests went in two transactions, the first of one request and the
second of the rest, 12 ms later). Each group's outcomes go back to the loop
in one wake-up (`call_soon_threadsafe`): a future for each waiting handler,
set there.

The writer thread also makes the group's `committed` call (the server's
nudge of its daemons: api/link.py) the moment a transaction that stored a
job ends, before the loop hears of it: a loop busy with a burst ran the
group's announcements milliseconds after the commit (measured at 32 and 128
streams of the paced engine: 1.9 and 8.1 ms p50).

A handler may pass a `stored` call with its submission: it runs there too,
for every job of the group, before any handler resumes (the server announces
its jobs to the daemons with it: a burst's announcements go out in one write
the moment its transaction is known, not one by one as each handler gets
its turn on the loop; measured, that wait was most of a burst's time from
the row to the daemon's claim). A handler cancelled after that call, before
it resumed, has its `abandoned` called with the job's id.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from fsched.core.ports.records import JobSubmission, KeyRevoked, QueueFull, SubmittedJob
from fsched.core.stamps import stamp

log = logging.getLogger("fsched.serve")

MAX_GROUP = 256  # submissions a transaction stores at most

Outcome = SubmittedJob | QueueFull | KeyRevoked
Store = Callable[[Sequence[JobSubmission], int], list[Outcome]]
JobCall = Callable[[int], None]
# A submission, its queue limit, its handler's loop and future, and its `stored` call (or None).
_Waiting = tuple[JobSubmission, int, asyncio.AbstractEventLoop, asyncio.Future, JobCall | None]


class Submitter:
    """The group commit: `submit` from handlers on an event loop, the stores on a thread of its own
    (started by the first submit, ended by `close` once what was queued before is stored)."""

    def __init__(self, store: Store, name: str = "fsched-submit",
                 committed: Callable[[], None] | None = None):
        self.store = store  # submissions, the queue limit -> each one's outcome (run on the writer thread)
        self.name = name
        self.committed = committed  # on the writer thread, after each transaction that stored a job
        self._queue: queue.SimpleQueue[_Waiting | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, prepare: Callable[[], None] | None = None) -> None:
        """Start the writer thread now (else the first submit does), `prepare` its first call there: what
        the stores make ready for the thread (a connection) before the first group comes. A failing
        `prepare` is logged and the thread goes on: its first group then makes ready what it needs."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, args=(prepare,), name=self.name, daemon=True)
            self._thread.start()

    async def submit(self, submission: JobSubmission, max_queued_per_tenant: int,
                     stored: JobCall | None = None, abandoned: JobCall | None = None) -> SubmittedJob:
        """Store one job (raises QueueFull over its tenant's limit, KeyRevoked for a revoked key).
        `stored(job_id)` runs on this loop as soon as the job is stored, before this call returns;
        `abandoned(job_id)` where this call was cancelled after that."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.start()
        self._queue.put((submission, max_queued_per_tenant, loop, future, stored))
        try:
            return await future
        except asyncio.CancelledError:
            if (stored is not None and abandoned is not None and future.done() and not future.cancelled()
                    and isinstance(outcome := future.result(), SubmittedJob)):
                abandoned(outcome.job_id)
            raise

    def close(self) -> None:
        """The writer ends once the submissions queued before are stored (nobody waits for it)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _work(self, prepare: Callable[[], None] | None = None) -> None:
        if prepare is not None:
            try:
                prepare()
            except Exception:  # noqa: BLE001 - a head start only: the first group makes ready what it needs
                log.warning("the group commit could not make its connection ready ahead", exc_info=True)
        while (first := self._queue.get()) is not None:
            group, ending = self._gathered(first)
            began = time.time()
            outcomes = self._stored(group)
            committed = time.time()
            if len(outcomes) != len(group):  # a store that broke its word: every handler hears it
                broken = RuntimeError(f"the group commit answered {len(outcomes)} of {len(group)} jobs")
                outcomes = [broken] * len(group)
            if self.committed is not None and any(isinstance(o, SubmittedJob) for o in outcomes):
                try:
                    self.committed()
                except Exception:  # noqa: BLE001 - a speed-up only: the loop's announcements still go
                    log.exception("the group commit's call after its transaction failed")
            for loop in {w[2] for w in group}:
                mine = [(w, o) for w, o in zip(group, outcomes, strict=True) if w[2] is loop]
                try:
                    loop.call_soon_threadsafe(_settle, mine, began, committed)
                except RuntimeError:  # its loop is closed: nobody waits for the answers
                    pass
            if ending:
                return

    def _gathered(self, first: _Waiting) -> tuple[list[_Waiting], bool]:
        """`first` and what else is queued, up to MAX_GROUP; whether `close` came among them."""
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                waiting = self._queue.get_nowait()
            except queue.Empty:
                break
            if waiting is None:
                return group, True
            group.append(waiting)
        return group, False

    def _stored(self, group: list[_Waiting]) -> list[Outcome | BaseException]:
        submissions = [w[0] for w in group]
        limit = min(w[1] for w in group)
        try:
            try:
                return self.store(submissions, limit)
            except Exception:  # noqa: BLE001 - each alone: a failure is then only its own
                return [self._alone(s, limit) for s in submissions]
        except BaseException as exc:  # noqa: BLE001 - the writer goes on: its handlers hear why, none hangs
            failed = RuntimeError(f"the group commit stopped: {exc!r}")  # an error its handlers answer
            return [failed] * len(group)

    def _alone(self, submission: JobSubmission, limit: int) -> Outcome | BaseException:
        try:
            (outcome,) = self.store([submission], limit)
            return outcome
        except Exception as exc:  # noqa: BLE001 - handed to its own handler
            return exc


def _settle(settled: list[tuple[_Waiting, Outcome | BaseException]], began: float, committed: float) -> None:
    """On the loop: each stored job's `stored` call, then each handler's outcome (a handler gone
    meanwhile: its row stays, and is run)."""
    for (_, _, _, future, stored), outcome in settled:
        if isinstance(outcome, SubmittedJob):
            stamp("grouped", outcome.job_id, began)  # its group's transaction began
            stamp("committed", outcome.job_id, committed)  # and ended
            if stored is not None and not future.done():
                try:
                    stored(outcome.job_id)
                except Exception:  # noqa: BLE001 - its handler's outcome is set all the same
                    log.exception("a stored job's call failed (job %d)", outcome.job_id)
    for (_, _, _, future, _), outcome in settled:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
