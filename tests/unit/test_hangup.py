"""api/hangup.py: one watcher of a request's client, for its first-news wait and its stream."""

from __future__ import annotations

import asyncio

import pytest

from fsched.api.hangup import HangUp

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Client:
    """An ASGI receive whose body is in; `leave` makes it say the client hung up."""

    def __init__(self):
        self.left = asyncio.Event()
        self.reads = 0

    async def receive(self) -> dict:
        self.reads += 1
        await self.left.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.left.set()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_wait_ends_with_its_work_and_the_watcher_goes_on_watching():
    client = Client()
    hang_up = HangUp(client.receive)
    work = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(work.set_result, "news")
    assert await hang_up.before(work, timeout=5) is False and work.result() == "news"
    client.leave()
    await settle()
    assert hang_up.gone and client.reads == 1  # the same watcher, one task, saw the later hang-up
    hang_up.stop()


async def test_a_wait_ends_when_the_client_hangs_up_first_and_its_work_is_left_running():
    client = Client()
    hang_up = HangUp(client.receive)
    work = asyncio.ensure_future(asyncio.sleep(10))
    asyncio.get_running_loop().call_later(0.01, client.leave)
    assert await hang_up.before(work, timeout=5) is True
    assert not work.done()
    work.cancel()
    hang_up.stop()


async def test_a_wait_ends_at_its_timeout_without_a_hang_up():
    client = Client()
    hang_up = HangUp(client.receive)
    work = asyncio.ensure_future(asyncio.sleep(10))
    started = asyncio.get_running_loop().time()
    assert await hang_up.before(work, timeout=0.05) is False
    assert 0.04 <= asyncio.get_running_loop().time() - started < 5 and not work.done()
    work.cancel()
    hang_up.stop()


async def test_an_armed_task_is_cancelled_by_a_hang_up_and_a_disarmed_one_is_not():
    client = Client()
    hang_up = HangUp(client.receive)

    async def stream(armed: bool) -> str:
        if armed:
            hang_up.arm(asyncio.current_task())
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            return "cancelled"
        finally:
            hang_up.disarm()
        return "ended"

    armed = asyncio.ensure_future(stream(True))
    await settle()
    client.leave()
    assert await asyncio.wait_for(armed, 5) == "cancelled" and hang_up.cancelled
    # The client is gone already: a task armed now is cancelled at once.
    assert await asyncio.wait_for(asyncio.ensure_future(stream(True)), 5) == "cancelled"
    hang_up.stop()


async def test_a_hang_up_after_disarming_cancels_nothing():
    client = Client()
    hang_up = HangUp(client.receive)
    hang_up.arm(asyncio.current_task())
    hang_up.disarm()
    client.leave()
    await settle()
    await asyncio.sleep(0.01)  # would raise CancelledError here, had the hang-up cancelled this task
    assert hang_up.gone and not hang_up.cancelled
    hang_up.stop()


async def test_stop_ends_the_watcher():
    client = Client()
    hang_up = HangUp(client.receive)
    await settle()
    hang_up.stop()
    await settle()
    client.leave()
    await settle()
    assert not hang_up.gone
