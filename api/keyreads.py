"""API keys read from the table in groups: one worker-thread call for the lookups that arrive together.

A request reads its key (a revoked key is refused at once; a chat or
completions request of a key its server has read before is the exception:
its key's revocation is checked where its row is stored, api/online.py), and
every open stream reads its key again once a second. Read one
call each, requests that arrive together (the streams that end in one engine
step, and their clients' next requests) each wake a worker thread and take a
pooled connection of their own, and past the pool's size open and close one:
measured at 64 streams of 8 tokens on SQLite, these reads were a sixth of
serve's CPU. Here lookups wait for the read under way, if any, and go
together in the next: each one's read starts after it was asked for, so a key
revoked before a request came is still seen revoked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from fsched.core.jobs.apikeys import ApiKey

# key ids -> each one's stored key (None: no such key), read off the event loop
ReadMany = Callable[[Sequence[str]], Awaitable[dict[str, ApiKey | None]]]


class KeyReads:
    def __init__(self, read_many: ReadMany):
        self.read_many = read_many
        self._pending: dict[str, list[asyncio.Future]] = {}
        self._task: asyncio.Future | None = None  # the reader, while it runs (kept: tasks are weak)

    async def get(self, key_id: str) -> ApiKey | None:
        """The key as stored now (read after this call began), or None."""
        future = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key_id, []).append(future)
        if self._task is None:
            self._task = asyncio.ensure_future(self._read())
        return await future

    async def _read(self) -> None:
        group: dict[str, list[asyncio.Future]] = {}
        try:
            while self._pending:
                group, self._pending = self._pending, {}
                try:
                    found = await self.read_many(list(group))
                except Exception as exc:  # noqa: BLE001 - each waiter gets the failure
                    for futures in group.values():
                        _settle(futures, exception=exc)
                else:
                    for key_id, futures in group.items():
                        _settle(futures, result=found.get(key_id))
                group = {}
        except BaseException as exc:  # the reader itself was stopped (the server is stopping)
            for futures in (*group.values(), *self._pending.values()):
                _settle(futures, exception=exc if isinstance(exc, Exception) else asyncio.CancelledError())
            self._pending = {}
            raise
        finally:
            self._task = None


def _settle(futures: list[asyncio.Future], result=None, exception: BaseException | None = None) -> None:
    for future in futures:
        if future.done():  # its request is gone
            continue
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
