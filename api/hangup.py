"""A client's hang-up, watched once for a request's whole life.

The server does not fail a write to a closed connection: the one way a
handler learns its client is gone is `receive()` saying `http.disconnect`.
A streamed request waits twice while its client may leave: for its first
news (its headers are held until then), then through its stream. One
watcher serves both (a task a wait, and a wait on two tasks, cost serve
about 20 µs a request): a wait can end on it (`before`), and a task armed
with it is cancelled when the client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class HangUp:
    """Watches one request's connection from its making until `stop`."""

    __slots__ = ("gone", "cancelled", "_armed", "_woken", "_listener")

    def __init__(self, receive: Callable[[], Awaitable[dict]]):
        self.gone = False  # the client hung up
        self.cancelled = False  # and its hang-up cancelled the task armed then
        self._armed: asyncio.Task | None = None
        self._woken: asyncio.Future | None = None  # what `before` waits on
        self._listener = asyncio.ensure_future(self._listen(receive))

    async def _listen(self, receive: Callable[[], Awaitable[dict]]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self._wake()
        if self._armed is not None:
            self._cancel()

    def arm(self, task: asyncio.Task) -> None:
        """From now until `disarm`, a hang-up cancels `task` (at once, if the client is gone already)."""
        self._armed = task
        if self.gone:
            self._cancel()

    def disarm(self) -> None:
        self._armed = None

    def _cancel(self) -> None:
        task, self._armed = self._armed, None
        self.cancelled = True
        task.cancel()

    async def before(self, work: asyncio.Future, timeout: float | None = None) -> bool:
        """Wait for `work` (at most `timeout`), unless the client hangs up first: True when it did."""
        if not (work.done() or self.gone):
            loop = asyncio.get_running_loop()
            self._woken = loop.create_future()
            work.add_done_callback(self._wake)
            timer = None if timeout is None else loop.call_later(timeout, self._wake)
            try:
                await self._woken
            finally:
                self._woken = None
                work.remove_done_callback(self._wake)
                if timer is not None:
                    timer.cancel()
        return self.gone and not work.done()

    def _wake(self, _done: object = None) -> None:
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)

    def stop(self) -> None:
        self._listener.cancel()
