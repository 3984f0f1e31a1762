"""Key lookups in groups (api/keyreads.py), over a stand-in table."""

from __future__ import annotations

import asyncio

from fsched.api.keyreads import KeyReads
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.types import RequestClass


def _key(key_id: str, revoked: bool = False) -> ApiKey:
    return ApiKey(key_id, "alice", RequestClass.REALTIME, "", "hash", 0.0, 1.0 if revoked else None)


class Table:
    """Records each read's ids; a read holds the loop's other tasks for a few turns (not wall time)."""

    TURNS = 5

    def __init__(self) -> None:
        self.keys = {"k1": _key("k1"), "k2": _key("k2")}
        self.reads: list[list[str]] = []

    async def __call__(self, ids):
        self.reads.append(sorted(ids))
        found = {i: self.keys.get(i) for i in ids}  # what the table holds as the read starts
        for _ in range(self.TURNS):
            await asyncio.sleep(0)
        if "broken" in ids:
            raise RuntimeError("the table cannot be read")
        return found


def test_lookups_arriving_together_are_one_read():
    async def go():
        table = Table()
        reads = KeyReads(table)
        got = await asyncio.gather(*(reads.get(k) for k in ["k1", "k2", "k1", "nope"] * 8))
        return table.reads, got

    calls, got = asyncio.run(go())
    assert calls == [["k1", "k2", "nope"]]
    assert [k and k.id for k in got] == ["k1", "k2", "k1", None] * 8


def test_a_lookup_made_during_a_read_waits_for_the_next_and_sees_a_revocation():
    async def go():
        table = Table()
        reads = KeyReads(table)
        first = asyncio.ensure_future(reads.get("k1"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the first read is under way
        table.keys["k1"] = _key("k1", revoked=True)  # revoked while it runs
        second = await reads.get("k1")
        return table.reads, await first, second

    calls, first, second = asyncio.run(go())
    assert calls == [["k1"], ["k1"]]
    assert not first.revoked and second.revoked


def test_a_failed_read_fails_its_lookups_and_the_next_read_runs():
    async def go():
        reads = KeyReads(Table())
        failed = await asyncio.gather(reads.get("broken"), reads.get("k1"), return_exceptions=True)
        return failed, await reads.get("k2")

    failed, later = asyncio.run(go())
    assert all(isinstance(f, RuntimeError) for f in failed)
    assert later.id == "k2"


def test_a_lookup_whose_request_went_away_does_not_stop_the_others():
    async def go():
        reads = KeyReads(Table())
        gone = asyncio.ensure_future(reads.get("k1"))
        kept = asyncio.ensure_future(reads.get("k1"))
        await asyncio.sleep(0)
        gone.cancel()
        return await kept

    assert asyncio.run(go()).id == "k1"
