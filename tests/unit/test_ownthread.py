"""api/ownthread.py: calls in order on one thread, results and exceptions back to the loop, a clean end."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fsched.api.ownthread import OwnThread


def test_calls_run_in_order_on_one_thread_and_their_results_come_back():
    own = OwnThread("fsched-test")
    seen: list[tuple[int, str]] = []

    def call(i: int):
        seen.append((i, threading.current_thread().name))
        return i * 10

    async def run():
        return await asyncio.gather(*(own.run(lambda i=i: call(i)) for i in range(5)))

    assert asyncio.run(run()) == [0, 10, 20, 30, 40]
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"fsched-test"}
    own.close()


def test_an_exception_reaches_its_caller_and_the_thread_goes_on():
    own = OwnThread("fsched-test")

    def fail():
        raise ValueError("refused")

    async def run():
        with pytest.raises(ValueError, match="refused"):
            await own.run(fail)
        return await own.run(lambda: "next")

    assert asyncio.run(run()) == "next"
    own.close()


def test_a_caller_cancelled_meanwhile_leaves_the_next_calls_unharmed():
    own = OwnThread("fsched-test")
    started = threading.Event()

    def slow():
        started.set()
        time.sleep(0.05)
        return "late"

    async def run():
        first = own.run(slow)
        await asyncio.to_thread(started.wait)
        first.cancel()
        return await own.run(lambda: "after")

    assert asyncio.run(run()) == "after"
    own.close()


def test_close_ends_the_thread_once_its_calls_are_done():
    own = OwnThread("fsched-test")

    async def run():
        return await own.run(lambda: threading.current_thread())

    thread = asyncio.run(run())
    own.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
