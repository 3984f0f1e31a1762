"""A server's cached table facts (api/facts.py): read once at a time when expired, whatever the requests
waiting on them, and read again before they expire while requests keep asking for them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from fsched.api import facts
from fsched.api.facts import AHEAD, CHECK_S, KEEP_WARM_S, Cached, due, refreshed
from fsched.api.state import DAEMONS_TTL_S, LIMITS_TTL_S, Backend, ServerState
from fsched.core.ports.memory.table import MemoryTable
from fsched.core.types import RequestClass


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


# -- read ahead of need (api/facts.py `due`, ServerState.refresh_ahead) ------------------------------------
def test_a_fact_is_due_once_most_of_its_ttl_has_passed_while_requests_ask_for_it():
    cached = Cached(value=1, at=100.0, asked=100.0)
    assert not due(cached, 1.0, 100.0 + 0.5 * AHEAD)  # still young
    assert due(cached, 1.0, 100.0 + AHEAD + 1e-9)
    assert due(cached, 1.0, 100.0 + KEEP_WARM_S)  # asked for lately enough
    assert not due(cached, 1.0, 100.0 + KEEP_WARM_S + 0.1)  # nobody asked: left to expire
    cached.reading = object()  # any read under way
    assert not due(cached, 1.0, 100.0 + AHEAD + 1e-9)  # a read is under way already


class Counted:
    """A store whose calls are counted by name (and can fail); `batches`: the keys of each
    `stored_and_rate_limits` read."""

    def __init__(self, store):
        self.store, self.calls, self.batches, self.fail = store, Counter(), [], False

    def __getattr__(self, name):
        found = getattr(self.store, name)

        def counted(*args):
            self.calls[name] += 1
            if name == "stored_and_rate_limits":
                self.batches.append(sorted(args[0]))
            if self.fail:
                raise RuntimeError("database busy")
            return found(*args)

        return counted


def _server() -> tuple[ServerState, Counted, list[str]]:
    state, keys, _, ids = _counted_server()
    return state, keys, ids


def _counted_server() -> tuple[ServerState, Counted, Counted, list[str]]:
    table = MemoryTable()
    keys, jobs = Counted(table.keys), Counted(table.catalog)
    backend = Backend(jobs=jobs, keys=keys, files=table.files, serving=table.serving)
    ids = [table.keys.create_key(t, RequestClass.REALTIME)[0].id for t in ("alice", "bob", "carol")]
    table.keys.set_key_limit(ids[0], "requests_per_minute", 5)
    return ServerState(backend=backend, hub=None), keys, jobs, ids


def test_the_facts_requests_ask_for_are_read_again_before_they_expire_the_keys_in_one_read():
    async def run():
        state, keys, (alice, bob, carol) = _server()
        await state.live_daemons(), await state.limits()
        assert await state.rate_limits(alice) == {"requests_per_minute": 5}
        await state.rate_limits(bob)
        read_at = state._limits.at
        now = time.monotonic()
        state.refresh_ahead(now)  # nothing due yet
        await asyncio.sleep(0.05)
        assert keys.batches == [] and state._limits.at == read_at
        keys.store.set_key_limit(bob, "requests_per_minute", 7)  # an admin's change meanwhile
        state.refresh_ahead(now + AHEAD * LIMITS_TTL_S)
        for _ in range(50):
            if keys.batches and state._rate_limits[bob].reading is None:
                break
            await asyncio.sleep(0.01)
        assert keys.batches == [sorted([alice, bob])]  # every key asked for lately in one read; not carol
        assert state._limits.at > read_at and state._daemons.at > read_at
        assert keys.calls["stored_limits"] == 1  # the limits came with the keys' read, not one of their own
        # within the TTL the request path reads nothing, and sees the change read ahead
        assert await state.rate_limits(bob) == {"requests_per_minute": 7}
        state.refresh_ahead(time.monotonic() + KEEP_WARM_S + 1)  # nobody asked since: nothing read
        await asyncio.sleep(0.05)
        assert len(keys.batches) == 1

    asyncio.run(run())


def test_a_read_ahead_that_fails_is_read_again_on_demand_by_the_next_request(caplog):
    async def run():
        state, keys, (alice, _, _) = _server()
        await state.rate_limits(alice)
        keys.fail = True
        state.refresh_ahead(time.monotonic() + LIMITS_TTL_S + 0.1)
        for _ in range(50):
            if keys.batches and state._rate_limits[alice].reading is None:
                break
            await asyncio.sleep(0.01)
        keys.fail = False
        state._rate_limits[alice].at -= LIMITS_TTL_S + 0.1  # expired: the request reads it itself
        return await state.rate_limits(alice)

    with caplog.at_level(logging.DEBUG, "fsched.serve"):
        assert asyncio.run(run()) == {"requests_per_minute": 5}
    assert "database busy" in caplog.text


# -- a period of requests on a simulated clock: how many reads, and how old what the requests use ---------
async def _settled(state: ServerState) -> None:
    """Every read under way done (they run in worker threads: the simulated clock stands still meanwhile)."""
    cached = [state._daemons, state._limits, *state._rate_limits.values()]
    for _ in range(500):
        if all(c.reading is None for c in cached):
            return
        await asyncio.sleep(0.001)
    raise AssertionError("a read never ended")


def test_while_requests_keep_coming_the_limits_and_the_keys_rate_limits_are_one_read_a_ttl(monkeypatch):
    """Over 10 s of requests every 0.3 s, with the server's look every CHECK_S: the limits and every key's
    rate limits are read together, once every AHEAD of their TTL at most (they were two reads each time,
    a key's rate limits two statements); no request reads on demand, none uses a value older than its TTL,
    and an admin's changes reach the requests within LIMITS_TTL_S."""
    clock = SimpleNamespace(now=1_000.0)
    monkeypatch.setattr(facts, "time", SimpleNamespace(monotonic=lambda: clock.now))
    seconds, change_at = 10.0, 1_005.0

    async def run():
        state, keys, jobs, (alice, bob, _) = _counted_server()
        keys.store.set_limit("tokens_per_minute", 100)
        await state.live_daemons(), await state.limits(), await state.rate_limits(alice)
        await state.rate_limits(bob)
        keys.calls.clear(), jobs.calls.clear()
        seen = []  # (when, how old the limits, bob's rate limits and the daemons were, what they read)
        for tick in range(1, round(seconds / CHECK_S) + 1):
            clock.now = 1_000.0 + tick * CHECK_S
            if clock.now >= change_at and not keys.store.stored_limits().get("max_queued_per_tenant"):
                keys.store.set_limit("max_queued_per_tenant", 3)  # an admin's changes, at 5 s
                keys.store.set_key_limit(bob, "requests_per_minute", 7)
            state.refresh_ahead(clock.now)
            await _settled(state)
            if tick % 3 == 0:  # a request
                limits, _ = await state.limits(), await state.live_daemons()
                bobs = await state.rate_limits(bob)
                await state.rate_limits(alice)
                seen.append((clock.now, clock.now - state._limits.at, clock.now - state._rate_limits[bob].at,
                             clock.now - state._daemons.at, limits.max_queued_per_tenant, bobs))
        return keys, jobs, seen

    keys, jobs, seen = asyncio.run(run())
    reads = seconds / (AHEAD * LIMITS_TTL_S)
    assert set(keys.calls) == {"stored_and_rate_limits"}, keys.calls  # nothing read on demand, nor apart
    assert keys.calls["stored_and_rate_limits"] <= reads + 1, keys.calls
    assert set(jobs.calls) == {"list_daemons"} and jobs.calls["list_daemons"] <= seconds / (
        AHEAD * DAEMONS_TTL_S) + 1, jobs.calls
    assert all(limits_age <= LIMITS_TTL_S and key_age <= LIMITS_TTL_S and daemons_age <= DAEMONS_TTL_S
               for _, limits_age, key_age, daemons_age, _, _ in seen), seen
    after = [(queued, bobs) for when, *_, queued, bobs in seen if when >= change_at + LIMITS_TTL_S]
    assert after and all(queued == 3 and bobs == {"requests_per_minute": 7, "tokens_per_minute": 100}
                         for queued, bobs in after), seen


def test_the_server_s_own_looks_at_a_fact_keep_nothing_read_ahead(monkeypatch):
    """The links' refresh looks at the live daemons every 0.5 s for the server's life, the retention
    sweep at the limits: reading on demand what expired, they leave the read-ahead to requests."""
    clock = SimpleNamespace(now=1_000.0)
    monkeypatch.setattr(facts, "time", SimpleNamespace(monotonic=lambda: clock.now))

    async def run():
        state, keys, jobs, _ = _counted_server()
        await state.live_daemons(), await state.limits()  # a request, then none
        ahead, looked = [], []  # reads a tick: started by refresh_ahead, by the server's own looks

        def reads() -> int:
            return jobs.calls["list_daemons"] + keys.calls["stored_limits"]

        for tick in range(1, round(2 * KEEP_WARM_S / CHECK_S) + 1):
            clock.now = 1_000.0 + tick * CHECK_S
            before = reads()
            state.refresh_ahead(clock.now)
            await _settled(state)
            ahead.append(reads() - before)
            before = reads()
            if tick % 5 == 0:
                await state.live_daemons(ask=False), await state.limits(ask=False)
            looked.append(reads() - before)
        later = round(KEEP_WARM_S / CHECK_S) + 1  # the ticks past KEEP_WARM_S after the request
        return ahead[:later], ahead[later:], looked[later:]

    kept_warm, ahead, looked = asyncio.run(run())
    assert sum(kept_warm) > 0  # within KEEP_WARM_S of the request: read ahead
    assert sum(ahead) == 0 and sum(looked) > 0  # then, however often the server looks: on demand
