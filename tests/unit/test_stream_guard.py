"""The rules an open stream is held to (api/guard.py) on the hub's ticks: one timer for every stream, and a
tick wakes only the streams that have something to check."""

from __future__ import annotations

import asyncio

from fsched.api.guard import Guard, KeepAlive, StreamEnd, StreamRules, guarded
from fsched.api.hub import ProgressHub
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.types import RequestClass

STREAMS = 8


def _key(revoked: bool = False) -> ApiKey:
    return ApiKey(id="k1", tenant="t", request_class=RequestClass.REALTIME, name="", secret_hash="",
                  created_at=0.0, revoked_at=1.0 if revoked else None)


class _Table:
    def __init__(self):
        self.revoked, self.live = False, 1
        self.key_reads = self.daemon_reads = 0

    async def read_key(self, key_id: str) -> ApiKey:
        self.key_reads += 1
        return _key(self.revoked)

    async def live_daemons(self) -> int:
        self.daemon_reads += 1
        return self.live


async def _streams(hub: ProgressHub, guard: Guard, table: _Table, seconds: float, act=None,
                   first: int = 0) -> list:
    """Each stream's last update after `seconds` (or its end), `act` called halfway; jobs `first` on."""
    ends: list = [None] * STREAMS

    async def one(i: int) -> None:
        async for update in guarded(hub, guard, first + i, _key(), table.read_key, table.live_daemons):
            ends[i] = update
            if isinstance(update, StreamEnd):
                return

    tasks = [asyncio.create_task(one(i)) for i in range(STREAMS)]
    await asyncio.sleep(seconds / 2)
    if act is not None:
        act()
    await asyncio.wait(tasks, timeout=seconds / 2)
    for task in tasks:
        task.cancel()
    return ends


def test_one_stream_of_a_key_is_woken_to_check_it_and_the_others_sleep_through_the_ticks():
    table = _Table()
    guard = Guard(StreamRules(keepalive_s=60, key_check_s=0.05))
    hub = ProgressHub(lambda ids: {})
    asyncio.run(_streams(hub, guard, table, 1.0))
    # Every stream woken at each tick would look for a live daemon at each: eight times the key's reads.
    assert table.key_reads >= 3
    assert table.daemon_reads <= 2 * table.key_reads + 2
    assert len(hub._ticking) <= 1  # one timer for every stream


def test_a_revoked_key_ends_every_stream_of_it_and_keep_alives_still_come():
    table = _Table()
    guard = Guard(StreamRules(keepalive_s=0.1, key_check_s=0.05))
    hub = ProgressHub(lambda ids: {})

    async def run():
        seen = await _streams(hub, guard, table, 1.0)  # keep-alives only: nothing is pushed
        assert all(isinstance(s, KeepAlive) for s in seen)

        def revoke():
            table.revoked = True

        return await _streams(hub, guard, table, 3.0, revoke, first=STREAMS)

    assert [getattr(s, "code", s) for s in asyncio.run(run())] == ["invalid_api_key"] * STREAMS


def test_no_live_daemon_ends_every_stream():
    table = _Table()
    guard = Guard(StreamRules(keepalive_s=60, key_check_s=0.05, no_daemon_s=0.2))
    hub = ProgressHub(lambda ids: {})

    def gone():
        table.live = 0

    ends = asyncio.run(_streams(hub, guard, table, 3.0, gone))
    assert [getattr(s, "code", s) for s in ends] == ["no_daemon"] * STREAMS
