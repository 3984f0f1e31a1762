"""One poller per server process: every open request's progress in one read of the table.

Handlers do not poll the table themselves: each registers its job and waits
on an event; the hub reads all registered jobs at once every `interval_s`
and wakes those whose row changed. 200 open streams cost one query a tick,
not 200.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import anyio.to_thread

from fsched.core.jobs.openai import OnlineProgress

# A job's requests, one a choice, in choice order.
Choices = tuple[OnlineProgress, ...]
Reader = Callable[[Sequence[int]], dict[int, Choices]]


@dataclass(slots=True)
class _Watch:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: Choices = ()


class ProgressHub:
    def __init__(self, read: Reader, interval_s: float = 0.005):
        self.read = read
        self.interval_s = interval_s
        self._watches: dict[int, _Watch] = {}
        self._wake = asyncio.Event()

    async def watch(self, job_id: int) -> AsyncIterator[Choices]:
        """Each change of the job's requests (its choices), until every one has ended (the last
        yielded is final)."""
        watch = self._watches[job_id] = _Watch()
        self._wake.set()
        seen = None
        try:
            while True:
                await watch.event.wait()
                watch.event.clear()
                choices = watch.latest
                key = tuple((p.state, p.num_output_tokens, len(p.output_text)) for p in choices)
                if key != seen:
                    seen = key
                    yield choices
                if all(p.state.finished for p in choices):
                    return
        finally:
            self._watches.pop(job_id, None)

    async def run(self) -> None:
        """Poll while anyone watches; sleep otherwise. Runs for the server's life."""
        while True:
            if not self._watches:
                self._wake.clear()
                await self._wake.wait()
            ids = list(self._watches)
            try:
                found = await anyio.to_thread.run_sync(self.read, ids)
            except Exception:  # noqa: BLE001 - a failed read (database busy, gone) is retried next tick
                found = {}
            for job_id, progress in found.items():
                watch = self._watches.get(job_id)
                if watch is not None:
                    watch.latest = progress
                    watch.event.set()
            await asyncio.sleep(self.interval_s)
