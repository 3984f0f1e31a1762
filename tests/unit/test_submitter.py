"""The online requests' group commit (api/submitter.py), over a stand-in store on the writer's thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fsched.api.submitter import Submitter
from fsched.core.ports.records import QueueFull, SubmittedJob
from fsched.core.types import RequestClass

WAIT_S = 10.0  # the most a test waits for the writer thread (it never should)


def _job(job_id: int, tenant: str) -> SubmittedJob:
    return SubmittedJob(job_id=job_id, num_requests=1, tenant=tenant, request_class=RequestClass.REALTIME,
                        tenant_created=False)


class Store:
    """Records each call's group and thread; `full` tenants are over their limit, a group of more than
    one fails whole under `fail_groups`, and "bad" always fails. With `gated`, each call waits until
    the test lets it end (`release`): what is submitted meanwhile is queued for the next group."""

    def __init__(self, full: set[str] = frozenset(), fail_groups: bool = False, gated: bool = False):
        self.calls: list[list[str]] = []
        self.threads: list[str] = []
        self.full, self.fail_groups, self.gated = full, fail_groups, gated
        self.next_id = 0
        self.began = threading.Semaphore(0)
        self._go = threading.Semaphore(0)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._go.release()

    def __call__(self, group, limit):
        self.calls.append(list(group))
        self.threads.append(threading.current_thread().name)
        self.began.release()
        if self.gated:
            assert self._go.acquire(timeout=WAIT_S)
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


async def _began(store: Store) -> None:
    """The writer's current call has begun."""
    assert await asyncio.to_thread(store.began.acquire, timeout=WAIT_S)


async def _queued(submitter: Submitter, tenants, limit: int = 10) -> list[asyncio.Task]:
    """Handlers submitting `tenants`, run until each has queued its submission."""
    tasks = [asyncio.ensure_future(submitter.submit(t, limit)) for t in tenants]
    await asyncio.sleep(0)  # each task runs to its await: its submission is queued
    return tasks


def test_requests_arriving_during_a_write_go_together_in_the_next_one():
    store = Store(gated=True)

    async def run():
        submitter = Submitter(store)
        (first,) = await _queued(submitter, "a")
        await _began(store)  # the first write starts alone
        rest = await _queued(submitter, "bcde")
        store.release(2)
        jobs = await asyncio.gather(first, *rest)
        submitter.close()
        return jobs

    jobs = asyncio.run(run())
    assert store.calls == [["a"], ["b", "c", "d", "e"]]
    assert [j.tenant for j in jobs] == list("abcde") and len({j.job_id for j in jobs}) == 5


def test_the_next_group_starts_when_a_write_ends_while_the_event_loop_is_busy():
    """The writer takes what is queued the moment a transaction ends, not when the loop next runs: a
    loop that never yields while the first write ends and the second runs still has both groups
    stored."""
    store = Store(gated=True)

    async def run():
        submitter = Submitter(store)
        (first,) = await _queued(submitter, "a")
        await _began(store)
        rest = await _queued(submitter, "bc")
        store.release(2)
        assert store.began.acquire(timeout=WAIT_S)  # the second group began, the loop held here
        assert store.calls == [["a"], ["b", "c"]]
        jobs = await asyncio.gather(first, *rest)
        submitter.close()
        return jobs

    assert [j.tenant for j in asyncio.run(run())] == ["a", "b", "c"]


def test_a_request_over_its_limit_is_refused_alone_and_a_failed_group_is_stored_one_by_one():
    store = Store(full={"full"}, gated=True)

    async def run():
        submitter = Submitter(store)
        (first,) = await _queued(submitter, ["a"])
        await _began(store)
        rest = await _queued(submitter, ["full", "bad", "b"])
        store.release(6)
        found = await asyncio.gather(first, *rest, return_exceptions=True)
        submitter.close()
        return found

    a, full, bad, b = asyncio.run(run())
    assert isinstance(a, SubmittedJob) and isinstance(b, SubmittedJob) and b.tenant == "b"
    assert isinstance(full, QueueFull) and full.tenant == "full"
    assert isinstance(bad, RuntimeError)  # only the one that cannot be stored fails
    assert store.calls == [["a"], ["full", "bad", "b"], ["full"], ["bad"], ["b"]]


def test_a_handler_gone_while_its_group_is_written_does_not_stop_the_others():
    store = Store(gated=True)

    async def run():
        submitter = Submitter(store)
        (first,) = await _queued(submitter, ["a"])
        await _began(store)
        gone, kept = await _queued(submitter, ["gone", "kept"])
        store.release()
        await _began(store)  # the second group's write has begun
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        store.release()
        found = await first, await kept
        submitter.close()
        return found

    first, kept = asyncio.run(run())
    assert kept.tenant == "kept" and store.calls[1] == ["gone", "kept"]  # its row is stored, and runs


def test_a_groups_stored_calls_all_run_before_any_of_its_handlers_resumes():
    """The server announces each job with its `stored` call: a burst's announcements all go before the
    first of its handlers takes its turn on the loop."""
    store = Store(gated=True)
    events: list[str] = []

    async def handler(submitter: Submitter, tenant: str) -> None:
        job = await submitter.submit(tenant, 10, stored=lambda job_id: events.append(f"stored {job_id}"))
        events.append(f"resumed {job.job_id}")

    async def run():
        submitter = Submitter(store)
        first = asyncio.ensure_future(handler(submitter, "a"))
        await _began(store)
        rest = [asyncio.ensure_future(handler(submitter, t)) for t in "bcd"]
        await asyncio.sleep(0)  # queued behind the first group
        store.release(2)
        await asyncio.gather(first, *rest)
        submitter.close()

    asyncio.run(run())
    assert store.calls == [["a"], ["b", "c", "d"]]
    burst = [e for e in events if not e.endswith(" 1")]
    assert burst == ["stored 2", "stored 3", "stored 4", "resumed 2", "resumed 3", "resumed 4"]
    assert events.index("stored 1") < events.index("resumed 1")


def test_a_handler_cancelled_after_its_stored_call_has_its_abandoned_call_and_one_gone_before_has_none():
    store = Store(gated=True)
    stored: list[int] = []
    abandoned: list[int] = []

    async def run():
        loop = asyncio.get_running_loop()
        submitter = Submitter(store)
        (first,) = await _queued(submitter, ["a"])
        await _began(store)
        tasks: dict[str, asyncio.Task] = {}

        def stored_then_cancelled(job_id: int) -> None:
            stored.append(job_id)
            # Its client goes away once the job is stored, before its handler resumes.
            loop.call_soon(tasks["after"].cancel)

        for tenant in ("before", "after"):
            tasks[tenant] = asyncio.ensure_future(submitter.submit(tenant, 10, stored_then_cancelled,
                                                                   abandoned.append))
        await asyncio.sleep(0)
        tasks["before"].cancel()  # gone while its group waits: no call at all
        store.release(2)
        for task in tasks.values():
            with pytest.raises(asyncio.CancelledError):
                await task
        await first
        submitter.close()

    asyncio.run(run())
    assert store.calls[1] == ["before", "after"]
    assert stored == [3] and abandoned == [3]


def test_close_ends_the_writer_once_what_was_queued_is_stored_and_a_later_submit_starts_another():
    store = Store()
    submitter = Submitter(store, name="fsched-test")

    async def one(tenant: str):
        return await submitter.submit(tenant, 10)

    assert asyncio.run(one("a")).tenant == "a"
    (writer,) = [t for t in threading.enumerate() if t.name == "fsched-test"]
    submitter.close()
    writer.join(timeout=WAIT_S)
    assert not writer.is_alive()
    assert asyncio.run(one("b")).tenant == "b"
    submitter.close()
    assert store.threads == ["fsched-test", "fsched-test"]


def test_a_servers_group_commit_runs_in_its_own_thread_one_group_at_a_time():
    """The server's store of a group: on the group commit's own thread, not a worker taken from anyio's
    pool, the same thread for every group; it ends with the server."""
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


def _fails_then_goes_on(store, first: str, then: str, why: str):
    """`first` submitted to a writer over `store`, refused with a RuntimeError saying `why`; then `then`,
    stored by the same writer (none hangs); the outcome of `then`."""
    async def run():
        submitter = Submitter(store)
        with pytest.raises(RuntimeError, match=why):
            await submitter.submit(first, 10)
        after = await submitter.submit(then, 10)
        submitter.close()
        return after

    return asyncio.run(run())


def test_a_store_that_raises_past_exception_fails_its_group_and_the_writer_goes_on():
    """Whatever a store raises reaches its handlers; the writer thread stays, so no later request hangs."""
    calls: list[list[str]] = []

    def store(group, limit):
        calls.append(list(group))
        if "stop" in group:
            raise SystemExit("not an Exception")
        return [_job(len(calls), tenant) for tenant in group]

    assert _fails_then_goes_on(store, "stop", "after", "SystemExit").tenant == "after"
    assert calls == [["stop"], ["after"]]


def test_a_store_that_answers_fewer_outcomes_than_jobs_fails_each_handler_and_the_writer_goes_on():
    answers = iter([[], None])

    def store(group, limit):
        found = next(answers)
        return found if found is not None else [_job(1, tenant) for tenant in group]

    assert _fails_then_goes_on(store, "a", "b", "answered 0 of 1").tenant == "b"


def test_a_group_that_stored_a_job_makes_the_committed_call_on_the_writer_thread_before_any_handler_resumes():
    store = Store(full={"full"})
    calls: list[tuple[str, int]] = []

    async def run():
        submitter = Submitter(store, committed=lambda: calls.append(
            (threading.current_thread().name, len(store.calls))))
        with pytest.raises(QueueFull):
            await submitter.submit("full", 10)  # stored nothing: no call
        assert calls == []
        resumed = await submitter.submit("a", 10)
        assert calls == [("fsched-submit", 2)]  # after the second transaction, before the handler went on
        submitter.close()
        return resumed

    assert asyncio.run(run()).job_id == 2


def test_a_committed_call_that_fails_costs_no_handler_its_answer():
    store = Store()

    def broken() -> None:
        raise RuntimeError("the daemons cannot be nudged")

    async def run():
        submitter = Submitter(store, committed=broken)
        jobs = await asyncio.gather(*(submitter.submit(t, 10) for t in "ab"))
        submitter.close()
        return jobs

    assert sorted(job.job_id for job in asyncio.run(run())) == [1, 2]


def test_start_makes_the_store_ready_on_the_writer_thread_before_the_first_group():
    """`start(prepare)`: the writer thread runs `prepare` first (what the store opens for the thread it
    writes on: its connection), and the groups after it on the same thread."""
    store = Store()
    prepared: list[str] = []
    submitter = Submitter(store, name="fsched-ready")
    submitter.start(lambda: prepared.append(threading.current_thread().name))

    async def one(tenant: str):
        return await submitter.submit(tenant, 10)

    assert asyncio.run(one("a")).tenant == "a"
    submitter.close()
    assert prepared == ["fsched-ready"] and store.threads == ["fsched-ready"]


def test_a_prepare_that_fails_is_logged_and_the_groups_are_stored_all_the_same(caplog):
    store = Store()
    submitter = Submitter(store)

    def broken() -> None:
        raise RuntimeError("the table is not there yet")

    submitter.start(broken)

    async def one(tenant: str):
        return await submitter.submit(tenant, 10)

    with caplog.at_level("WARNING", logger="fsched.serve"):
        assert asyncio.run(one("a")).tenant == "a"
    submitter.close()
    assert "could not make its connection ready ahead" in caplog.text


def test_a_server_starts_its_group_commit_and_makes_the_store_ready_before_any_request():
    """The server's start (its lifespan) starts the group commit's thread with the store's
    `prepare_submits`, before any online request comes."""
    from fastapi.testclient import TestClient

    from fsched.api.app import create_app
    from fsched.api.state import Backend
    from fsched.core.ports.memory import MemoryTable

    table = MemoryTable()
    prepared = threading.Event()
    where: list[str] = []

    def prepare_submits() -> None:
        where.append(threading.current_thread().name)
        prepared.set()

    table.catalog.prepare_submits = prepare_submits
    app = create_app(Backend.of(table), link=False)
    with TestClient(app):
        assert prepared.wait(WAIT_S)
    assert where and where[0].startswith("fsched-submit")
