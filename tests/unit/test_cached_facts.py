"""A server's cached table facts (api/state.py `refreshed`): read once at a time when expired, whatever
the requests waiting on them."""

from __future__ import annotations

import asyncio

import pytest

from fsched.api.state import Cached, refreshed


class Reads:
    """A read that holds for a few turns of the event loop (the database call), counting calls."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    async def __call__(self) -> int:
        self.calls += 1
        for _ in range(5):  # others arrive meanwhile
            await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("database busy")
        return self.calls


def test_requests_arriving_during_a_read_wait_for_it_instead_of_reading_too():
    async def run():
        cached, read = Cached(), Reads()
        got = await asyncio.gather(*(refreshed(cached, 60.0, read) for _ in range(20)))
        again = await refreshed(cached, 60.0, read)  # within its TTL: no read
        expired = await refreshed(cached, 0.0, read)  # past it: read again
        return got, again, expired, read.calls

    got, again, expired, calls = asyncio.run(run())
    assert got == [1] * 20 and again == 1 and expired == 2 and calls == 2


def test_a_failed_read_fails_its_waiters_and_the_next_request_reads_again():
    async def run():
        cached, read = Cached(), Reads(fail=True)
        outcomes = await asyncio.gather(*(refreshed(cached, 60.0, read) for _ in range(3)),
                                        return_exceptions=True)
        read.fail = False
        return outcomes, await refreshed(cached, 60.0, read), read.calls

    outcomes, value, calls = asyncio.run(run())
    assert all(isinstance(o, RuntimeError) for o in outcomes) and value == 2 and calls == 2


def test_a_waiter_cancelled_leaves_the_read_to_the_others():
    async def run():
        cached, read = Cached(), Reads()
        first = asyncio.ensure_future(refreshed(cached, 60.0, read))
        second = asyncio.ensure_future(refreshed(cached, 60.0, read))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second, read.calls

    assert asyncio.run(run()) == (1, 1)
