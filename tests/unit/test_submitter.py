"""The online requests' group commit (api/submitter.py), over a stand-in store."""

from __future__ import annotations

import asyncio

import pytest

from fsched.api.submitter import Submitter
from fsched.core.ports.records import QueueFull, SubmittedJob
from fsched.core.types import RequestClass


def _job(job_id: int, tenant: str) -> SubmittedJob:
    return SubmittedJob(job_id=job_id, num_requests=1, tenant=tenant, request_class=RequestClass.REALTIME,
                        tenant_created=False)


class Store:
    """Records each call's group; `fail_groups` makes a group of more than one fail whole.

    A write holds the event loop's other tasks for a few turns (the transaction), not for wall time:
    what arrives meanwhile is what the loop ran in those turns, the same on any machine.
    """

    TURNS = 5

    def __init__(self, full: set[str] = frozenset(), fail_groups: bool = False):
        self.calls: list[list[str]] = []
        self.full, self.fail_groups = full, fail_groups
        self.next_id = 0

    async def __call__(self, group, limit):
        self.calls.append(list(group))
        for _ in range(self.TURNS):  # the transaction: others arrive meanwhile
            await asyncio.sleep(0)
        if self.fail_groups and len(group) > 1:
            raise RuntimeError("one of them cannot be stored")
        if "bad" in group:
            raise RuntimeError("this one cannot be stored")
        out = []
        for tenant in group:
            self.next_id += 1
            full = tenant in self.full
            out.append(QueueFull(tenant, limit, 1, limit) if full else _job(self.next_id, tenant))
        return out


def test_requests_arriving_during_a_write_go_together_in_the_next_one():
    store = Store()

    async def run():
        submitter = Submitter(store)
        first = asyncio.ensure_future(submitter.submit("a", 10))
        await asyncio.sleep(0)  # the first write starts alone
        rest = [asyncio.ensure_future(submitter.submit(t, 10)) for t in "bcde"]
        return await asyncio.gather(first, *rest)

    jobs = asyncio.run(run())
    assert store.calls == [["a"], ["b", "c", "d", "e"]]
    assert [j.tenant for j in jobs] == list("abcde") and len({j.job_id for j in jobs}) == 5


def test_a_request_over_its_limit_is_refused_alone_and_a_failed_group_is_stored_one_by_one():
    store = Store(full={"full"})

    async def run():
        submitter = Submitter(store)
        first = asyncio.ensure_future(submitter.submit("a", 10))
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(submitter.submit(t, 10)) for t in ("full", "bad", "b")]
        return await asyncio.gather(first, *rest, return_exceptions=True)

    a, full, bad, b = asyncio.run(run())
    assert isinstance(a, SubmittedJob) and isinstance(b, SubmittedJob) and b.tenant == "b"
    assert isinstance(full, QueueFull) and full.tenant == "full"
    assert isinstance(bad, RuntimeError)  # only the one that cannot be stored fails
    assert store.calls == [["a"], ["full", "bad", "b"], ["full"], ["bad"], ["b"]]


def test_a_handler_gone_while_its_group_is_written_does_not_stop_the_others():
    store = Store()

    async def run():
        submitter = Submitter(store)
        first = asyncio.ensure_future(submitter.submit("a", 10))
        await asyncio.sleep(0)
        gone = asyncio.ensure_future(submitter.submit("gone", 10))
        kept = asyncio.ensure_future(submitter.submit("kept", 10))
        while len(store.calls) < 2:  # the second group's write has begun
            await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await first, await kept

    first, kept = asyncio.run(run())
    assert kept.tenant == "kept" and store.calls[1] == ["gone", "kept"]  # its row is stored, and runs


def test_a_servers_group_commit_runs_in_its_own_thread_one_group_at_a_time():
    """The server's store of a group: on the group commit's own thread (api/ownthread.py, not a worker
    taken from anyio's pool), the same thread for every group; it ends with the server."""
    import threading
    from types import SimpleNamespace

    from fsched.api.state import ServerState

    threads: list[str] = []

    def submit_each(group, max_queued_per_tenant):
        threads.append(threading.current_thread().name)
        return [_job(i + 1, tenant) for i, tenant in enumerate(group)]

    state = ServerState(backend=SimpleNamespace(jobs=SimpleNamespace(submit_each=submit_each)), hub=None)

    async def run():
        first = await state.submit_online("a", 10)
        second = await state.submit_online("b", 10)
        return first, second

    first, second = asyncio.run(run())
    assert (first.tenant, second.tenant) == ("a", "b")
    assert len(threads) == 2 and threads[0] == threads[1] and threads[0].startswith("fsched-submit")
    state.close()
