"""Online requests stored by group commit: one write transaction for the requests that arrive together.

Every online request is a row before it runs. Stored one transaction each,
requests that come together (a batch of streams ending in one engine step,
and their clients sending the next ones) queue for the table's write lock,
and the last waits for all the others: measured on SQLite with 8 streams,
submits waited up to 128 ms for the lock. Here the handlers hand their
submissions to one writer: while it stores one group, the next gathers, and
goes in one transaction (`CatalogStore.submit_each`) as soon as that one is done.
A request over its tenant's queue limit gets its own QueueFull, one whose key
was revoked its KeyRevoked; a group whose transaction fails is stored again
one by one, so that a failure is only its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from fsched.core.ports.records import JobSubmission, KeyRevoked, QueueFull, SubmittedJob
from fsched.core.stamps import stamp

MAX_GROUP = 256  # submissions a transaction stores at most

Outcome = SubmittedJob | QueueFull | KeyRevoked
Store = Callable[[Sequence[JobSubmission], int], Awaitable[list[Outcome]]]


class Submitter:
    def __init__(self, store: Store):
        self.store = store  # submissions, the queue limit -> each one's outcome (off the event loop)
        self._pending: list[tuple[JobSubmission, int, asyncio.Future]] = []
        self._writing = False
        self._task: asyncio.Future | None = None  # the writer, while it runs (kept: tasks are weak)

    async def submit(self, submission: JobSubmission, max_queued_per_tenant: int) -> SubmittedJob:
        """Store one job (raises QueueFull over its tenant's limit, KeyRevoked for a revoked key)."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((submission, max_queued_per_tenant, future))
        if not self._writing:
            self._writing = True
            self._task = asyncio.ensure_future(self._write())
        return await future

    async def _write(self) -> None:
        group: list = []
        try:
            while self._pending:
                group, self._pending = self._pending[:MAX_GROUP], self._pending[MAX_GROUP:]
                limit = min(limit for _, limit, _ in group)
                began = time.time()
                try:
                    outcomes = await self.store([s for s, _, _ in group], limit)
                except Exception:  # noqa: BLE001 - each alone: a failure is then only its own
                    outcomes = [await self._alone(s, limit) for s, _, _ in group]
                for (_, _, future), outcome in zip(group, outcomes, strict=True):
                    if isinstance(outcome, SubmittedJob):
                        stamp("grouped", outcome.job_id, began)  # its group's transaction began
                    if future.done():  # its handler is gone (the row stays, and is run)
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
                group = []
        except BaseException as exc:  # the writer itself stopped (the server is stopping): nobody waits
            for _, _, future in group + self._pending:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            self._pending = []
            raise
        finally:
            self._writing = False

    async def _alone(self, submission: JobSubmission, limit: int) -> Outcome | BaseException:
        try:
            (outcome,) = await self.store([submission], limit)
            return outcome
        except Exception as exc:  # noqa: BLE001 - handed to its own handler
            return exc
