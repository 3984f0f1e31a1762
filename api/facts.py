"""Short caches of table facts (live daemons, limits, a key's rate limits), kept fresh ahead of need.

A server trusts what it read of the table for a short while (api/state.py's
TTLs: daemons come and go, an admin's limits apply within them). A request
that finds a fact expired waits for its read: a thread hop and a query, one
fact after another (1-4 ms of the first token at 1-8 streams, where a
stream's next request comes a second or more after its last). So while
requests keep asking for a fact, the server reads it again once `AHEAD` of
its TTL has passed, off their path; a fact nobody asked for in
`KEEP_WARM_S` is left to expire and is read on demand again. The TTLs'
promises hold either way: no request uses a value older than its TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("fsched.serve")

KEEP_WARM_S = 10.0  # a fact asked for within this long is read again before it expires
AHEAD = 0.6  # ... once this share of its TTL has passed
CHECK_S = 0.1  # how often the server looks for facts due (a wake-up, no read, when none is)


@dataclass(slots=True)
class Cached(Generic[T]):
    value: T | None = None
    at: float = -1e18  # when it was read (monotonic)
    reading: asyncio.Future | None = None  # the read under way: requests meanwhile wait for it
    asked: float = -1e18  # when a request last asked for it


async def refreshed(cached: Cached[T], ttl_s: float, read: Callable[[], Awaitable[T]], ask: bool = True) -> T:
    """The cached value, read again once older than `ttl_s`: one read at a time, whatever the
    requests arriving while it runs (each would otherwise read too, all of them at every expiry).
    Without `ask` (a task of the server's own that may wait for a read: the links' refresh, a sweep)
    the look does not keep the fact read ahead (`due`): it would, for the server's life."""
    now = time.monotonic()
    if ask:
        cached.asked = now
    if now - cached.at <= ttl_s:
        return cached.value
    return await asyncio.shield(start_read(cached, read))


def due(cached: Cached, ttl_s: float, now: float, keep_warm_s: float = KEEP_WARM_S,
        ahead: float = AHEAD) -> bool:
    """Whether to read a fact again now, before a request finds it expired: it was asked for
    lately, most of its TTL has passed, and no read of it is under way."""
    return cached.reading is None and now - cached.asked <= keep_warm_s and now - cached.at >= ahead * ttl_s


def start_read(cached: Cached[T], read: Callable[[], Awaitable[T]]) -> asyncio.Future:
    """The read under way, or a new one: its value goes to the cache when it comes."""
    if cached.reading is None:
        cached.reading = asyncio.ensure_future(_fill(cached, read))
        cached.reading.add_done_callback(note_failed_read)
    return cached.reading


async def _fill(cached: Cached[T], read: Callable[[], Awaitable[T]]) -> T:
    try:
        value = await read()
        cached.value, cached.at = value, time.monotonic()
        return value
    finally:
        cached.reading = None


def note_failed_read(done: asyncio.Future) -> None:
    """A read nobody waited for (ahead of need) that failed: the next request reads on demand and
    meets the error itself; noted here, not left as an unretrieved exception."""
    if not done.cancelled() and done.exception() is not None:
        log.debug("reading a cached table fact failed: %s", done.exception())


async def keep_fresh_forever(refresh_ahead: Callable[[float], None], check_s: float = CHECK_S) -> None:
    """Every `check_s`, `refresh_ahead(now)` starts the reads of the facts due (api/state.py)."""
    while True:
        await asyncio.sleep(check_s)
        refresh_ahead(time.monotonic())
