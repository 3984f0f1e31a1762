"""The CatalogStore contract, one set of tests run on every implementation: in memory, SQLite, PostgreSQL.

Each test states a rule of `core/ports/catalog.py`'s contract (submit, the
queue limit, counters and states, cancel, results, tenants, daemons), seen
through the catalog while the queue moves the requests, as the commands see
a daemon's work. The in-memory catalog (what the commands' and the HTTP
server's unit tests run on) is held to the same rules as the SQL one.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.openai.results import lines_of, output_line
from fsched.core.ports.catalog import CatalogStore
from fsched.core.ports.records import (
    Completion,
    DaemonStats,
    DaemonSummary,
    JobSubmission,
    KeyRevoked,
    QueueFull,
    TenantBusy,
    TenantExists,
    TokenUpdate,
    UnknownJob,
    UnknownTenant,
)
from fsched.core.types import (
    Endpoint,
    JobOrigin,
    JobState,
    RequestClass,
    RequestSpec,
    RequestStatus,
    SamplingParams,
)
from fsched.storage import sql_catalog
from tests.fakes import FakeClock
from tests.support.store import finish
from tests.support.tables import KINDS, SHORT_LEASE_S, open_table, submission


@pytest.fixture(params=KINDS)
def table(request):
    made = open_table(request, request.param)
    yield made
    made.close()


@pytest.fixture(params=KINDS)
def at_100(request):
    """A table whose clock reads 100.0 (what it stamps submits and ends with)."""
    made = open_table(request, request.param, clock=FakeClock(100.0))
    yield made
    made.close()


def test_it_is_a_catalog_store(table):
    assert isinstance(table.catalog, CatalogStore)


# -- submit and the queue limit -------------------------------------------------------------------


def test_submit_stores_job_requests_and_new_tenant(table):
    store = table.catalog
    (job,) = store.submit([submission(3)])
    assert job.num_requests == 3 and job.tenant_created
    (second,) = store.submit([submission(2)])
    assert not second.tenant_created and second.job_id > job.job_id
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.state is JobState.QUEUED and summary.counts.num_waiting == 3
    (tenant,) = store.list_tenants()
    assert (tenant.name, tenant.weight, tenant.active_jobs, tenant.queued) == ("alice", 1.0, 2, 5)


def test_every_stored_request_has_a_seed(table):
    table.catalog.submit([submission(5)])
    claimed = table.queue.claim("d", per_group=10)
    seeds = [c.params.seed for c in claimed]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == 5


def test_submit_is_all_or_nothing(table):
    bad = tuple(
        RequestSpec(custom_id="same", endpoint=Endpoint.COMPLETIONS, params=SamplingParams(4), prompt="x")
        for _ in range(2)
    )
    good = submission(3, tenant="bob")
    with pytest.raises(table.duplicate_error):
        table.catalog.submit([good, JobSubmission(bad, "carol", RequestClass.BATCH, 5, "bad")])
    assert table.catalog.list_jobs() == [] and table.catalog.list_tenants() == []


def queued(table) -> dict[str, int]:
    return {t.name: t.queued + t.running for t in table.catalog.list_tenants()}


def test_a_submit_over_the_limit_is_refused_whole(table):
    store = table.catalog
    store.submit([submission(6)], max_queued_per_tenant=10)
    store.submit([submission(4)], max_queued_per_tenant=10)  # exactly at the limit: fine
    with pytest.raises(QueueFull) as info:
        # Several files in one submit count together; bob's file is refused with alice's.
        store.submit([submission(1, "bob"), submission(1)], max_queued_per_tenant=10)
    assert str(info.value) == (
        "tenant 'alice' has 10 unfinished request(s); 1 more would go over the limit of 10 a tenant "
        "(FSCHED_MAX_QUEUED_PER_TENANT); nothing was submitted"
    )
    assert queued(table) == {"alice": 10}
    assert len(store.list_jobs()) == 2 and "bob" not in queued(table)  # not even bob's tenant row
    store.submit([submission(10, "bob")], max_queued_per_tenant=10)  # the limit is per tenant


def test_finished_requests_free_room_and_running_ones_do_not(table):
    store = table.catalog
    (first,) = store.submit([submission(5)], max_queued_per_tenant=8)
    claimed = table.queue.claim("d1", per_group=2)
    assert len(claimed) == 2
    with pytest.raises(QueueFull):  # 5 unfinished (2 of them running) + 4 > 8
        store.submit([submission(4)], max_queued_per_tenant=8)
    store.cancel_job(first.job_id)  # the 3 waiting ones end now; the 2 running ones still count
    store.submit([submission(6)], max_queued_per_tenant=8)
    with pytest.raises(QueueFull, match="has 8 unfinished"):
        store.submit([submission(1)], max_queued_per_tenant=8)


def test_concurrent_submits_cannot_both_slip_under_the_limit(table):
    table.catalog.submit([submission(1)], max_queued_per_tenant=10)  # the tenant row exists: it is locked
    results: list[str] = []
    start = threading.Barrier(4)

    def submit_six() -> None:
        mine = table.another()  # another process's stores over the same table
        start.wait()
        try:
            mine.catalog.submit([submission(6)], max_queued_per_tenant=10)
            results.append("ok")
        except QueueFull:
            results.append("full")
        finally:
            mine.close()

    threads = [threading.Thread(target=submit_six) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["full", "full", "full", "ok"]
    assert queued(table) == {"alice": 7}


def test_first_submits_of_a_new_tenant_at_once_all_land(table):
    handles = [table.another() for _ in range(6)]
    barrier = threading.Barrier(len(handles))
    errors, created = [], []

    def submit(handle):
        barrier.wait()
        try:
            jobs = handle.catalog.submit([submission(2, tenant="newbie")])
            created.extend(job.tenant_created for job in jobs)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(created) == len(handles)
    assert sum(created) == 1  # one of them created the tenant
    assert table.catalog.list_tenants()[0].queued == 2 * len(handles)
    for h in handles:
        h.close()


def test_a_group_commit_stores_each_job_on_its_own_terms(table):
    store = table.catalog
    store.submit([submission(8)], max_queued_per_tenant=10)
    outcomes = store.submit_each([submission(1), submission(1, "bob"), submission(2), submission(1)],
                                 max_queued_per_tenant=10)
    first, bob, over, last = outcomes
    assert first.tenant == "alice" and bob.tenant == "bob" and bob.tenant_created  # stored, in order
    assert isinstance(over, QueueFull) and over.tenant == "alice"  # 9 + 2 > 10: this one alone
    assert last.tenant == "alice" and last.job_id > bob.job_id > first.job_id  # 9 + 1 fits
    assert queued(table) == {"alice": 10, "bob": 1}
    assert len([j for j in store.list_jobs() if j.tenant == "alice"]) == 3


def test_a_group_commit_gives_each_stored_job_its_own_requests_around_a_refused_one(table):
    """Jobs of several requests each, one refused between them: every stored job holds exactly its own
    request rows (SQLite makes the rows before its transaction and gives them their job's id in it)."""
    store = table.catalog
    store.submit([submission(7)], max_queued_per_tenant=10)
    sizes = [("bob", 1), ("alice", 2), ("alice", 3), ("bob", 3), ("alice", 1)]  # alice: 7 + 2, refused 3, + 1
    outcomes = store.submit_each([submission(n, tenant) for tenant, n in sizes], max_queued_per_tenant=10)
    assert isinstance(outcomes[2], QueueFull)
    for (tenant, n), outcome in zip(sizes, outcomes, strict=True):
        if outcome is outcomes[2]:
            continue
        rows = store.request_progress(outcome.job_id)
        assert [r.job_id for r in rows] == [outcome.job_id] * n and outcome.tenant == tenant
    assert queued(table) == {"alice": 10, "bob": 4}


def test_group_commits_of_two_servers_at_once_give_each_job_its_own_id_and_rows(table):
    """Each outcome's job id names that job: its tenant and its requests (SQLite gives the ids itself,
    after the highest, in the transaction that holds the write lock)."""
    handles = [table.another() for _ in range(2)]
    barrier = threading.Barrier(len(handles))
    stored, errors = [], []

    def serve(handle, tenant: str) -> None:
        barrier.wait()
        try:
            for size in (1, 3, 8, 2, 5):
                group = [submission(1 + i % 2, tenant=tenant) for i in range(size)]
                for s, outcome in zip(group, handle.catalog.submit_each(group, max_queued_per_tenant=1_000),
                                      strict=True):
                    stored.append((outcome.job_id, tenant, len(s.requests)))
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(h, tenant))
               for h, tenant in zip(handles, ("ann", "ben"), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(stored) == 2 * 19
    assert len({job_id for job_id, _, _ in stored}) == len(stored)
    jobs = {job.id: job for job in table.catalog.list_jobs()}
    for job_id, tenant, n in stored:  # the job and its own requests' rows
        assert (jobs[job_id].tenant, jobs[job_id].counts.num_requests) == (tenant, n)
        assert [p.job_id for p in table.catalog.request_progress(job_id)] == [job_id] * n
    for h in handles:
        h.close()


def test_a_group_commit_stores_no_job_of_a_revoked_or_unknown_key(table):
    kept, _ = table.keys.create_key("alice", RequestClass.REALTIME)
    gone, _ = table.keys.create_key("alice", RequestClass.REALTIME)
    table.keys.revoke_key(gone.id)

    def of(key_id: str | None) -> JobSubmission:
        return dataclasses.replace(submission(1), key_id=key_id)

    outcomes = table.catalog.submit_each([of(kept.id), of(gone.id), of("000000000000"), of(None)],
                                         max_queued_per_tenant=10)
    stored, revoked, unknown, keyless = outcomes
    assert isinstance(revoked, KeyRevoked) and revoked.key_id == gone.id
    assert isinstance(unknown, KeyRevoked) and unknown.key_id == "000000000000"
    assert {j.id for j in table.catalog.list_jobs()} == {stored.job_id, keyless.job_id}


def test_a_group_commit_runs_its_statements_on_the_driver_not_through_sqlalchemy(table):
    """A group commit's statements are compiled once and run on a connection kept for it, not through
    SQLAlchemy's execution (its events see none of them): on PostgreSQL one query, sent with the rest of
    the transaction in one round trip (tests/integration/test_group_commit_trips.py counts it); on
    SQLite a statement per job and one for all the requests."""
    if table.kind == "memory":
        pytest.skip("statements are SQL's")
    from sqlalchemy import event

    engine = table.catalog.db.engine
    inserts: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            inserts.append(statement)

    table.catalog.submit_each([submission(1, "carol")], max_queued_per_tenant=100)  # the tenant exists
    event.listen(engine, "before_cursor_execute", seen)
    try:
        group = [submission(1, "carol") for _ in range(5)] + [submission(2, "carol")]
        outcomes = table.catalog.submit_each(group, max_queued_per_tenant=100)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert inserts == []
    ids = [o.job_id for o in outcomes]
    assert ids == sorted(ids) and len(set(ids)) == 6
    assert [table.catalog.list_jobs(job_id=i)[0].counts.num_requests for i in ids] == [1] * 5 + [2]


# -- counters, states, cancel ---------------------------------------------------------------------------


def test_claim_finish_and_counters(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([submission(3)])
    claimed = queue.claim("daemon-1", per_group=2)
    assert [c.custom_id for c in claimed] == ["c0", "c1"]
    assert store.list_jobs(job_id=job.job_id)[0].state is JobState.IN_PROGRESS
    assert finish(queue, claimed[0].id, RequestStatus.FINISHED_LENGTH, [5, 6, 7], "abc", 3, "tiny")
    # No request ends twice: a second finish changes nothing.
    assert not finish(queue, claimed[0].id, RequestStatus.FINISHED_FAILED, error="late")
    assert finish(queue, claimed[1].id, RequestStatus.FINISHED_FAILED, error="boom")
    summary = store.list_jobs(job_id=job.job_id)[0]
    c = summary.counts
    assert (c.num_done, c.num_failed, c.num_running, c.num_waiting) == (1, 1, 0, 1)
    assert summary.num_output_tokens == 3
    (rest,) = queue.claim("daemon-1", per_group=5)
    finish(queue, rest.id, RequestStatus.FINISHED_STOPPED, [1], "z")
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.state is JobState.COMPLETED and summary.finished_at is not None


def test_cancel_waiting_at_once_and_running_by_the_daemon(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([submission(4)])
    running = queue.claim("d", per_group=2)
    finish(queue, running[0].id, RequestStatus.FINISHED_STOPPED, [1, 2], "ok")
    outcome = store.cancel_job(job.job_id)
    assert (outcome.cancelled_now, outcome.stopping, outcome.state) == (2, 1, JobState.CANCELLING)
    assert queue.claim("d", per_group=10) == []  # nothing of a cancelled job is claimed again
    finish(queue, running[1].id, RequestStatus.FINISHED_CANCELLED, [3], "c")
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.state is JobState.CANCELLED
    assert [r.output_text for r in store.iter_results(job.job_id)] == ["ok"]  # finished work kept
    assert len(list(store.iter_results(job.job_id, errors=True))) == 3
    again = store.cancel_job(job.job_id)
    assert again.already_finished and again.state is JobState.CANCELLED


def test_unknown_job(table):
    store = table.catalog
    with pytest.raises(UnknownJob, match="no job with id 42"):
        store.cancel_job(42)
    with pytest.raises(UnknownJob):
        store.list_jobs(job_id=42)
    with pytest.raises(UnknownJob):
        list(store.iter_results(42))
    with pytest.raises(UnknownJob):
        store.request_progress(42)


def test_flush_release_and_fencing_keep_the_counters(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([submission(3)])
    a, b, c = queue.claim("d1", per_group=10)
    assert queue.flush_tokens("d1", [TokenUpdate(a.id, (5, 6), "xy", first_token_at=10.0),
                                     TokenUpdate(b.id, (7,), "z")]) == 2
    assert queue.flush_tokens("intruder", [TokenUpdate(c.id, (1,), "no")]) == 0  # not its lease
    assert store.list_jobs(job_id=job.job_id)[0].num_output_tokens == 3
    assert not finish(queue, a.id, RequestStatus.FINISHED_STOPPED, [5, 6, 9], "xyw", owner="intruder")
    assert queue.release("d1", [b.id]) == 1  # back to the queue, tokens kept
    (again,) = queue.claim("d2", per_group=10)
    assert again.id == b.id and again.resumed == [7]
    assert queue.release() == 3  # all running, whoever held them: a dead daemon's leftovers
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.counts.num_running == 0 and summary.counts.num_waiting == 3
    assert summary.num_output_tokens == 3


def test_a_write_under_a_lease_shows_in_the_results(table):
    store, queue = table.catalog, table.queue
    store.submit([submission(1)])
    (first,) = queue.claim("d1", per_group=5, lease_s=30)
    assert queue.release("d1") == 1
    (second,) = queue.claim("d1", per_group=5, lease_s=30)  # the same daemon, a new lease
    stale = Completion(first.id, RequestStatus.FINISHED_STOPPED, (1,), "a", lease_epoch=1)
    assert queue.finish_requests([stale], "d1") == [False]
    assert queue.flush_tokens("d1", [TokenUpdate(first.id, (1, 2), "ab", lease_epoch=2)]) == 1
    assert queue.finish_requests([Completion(first.id, RequestStatus.FINISHED_STOPPED, (1, 2, 3), "abc",
                                             lease_epoch=second.lease_epoch)], "d1") == [True]
    (result,) = store.iter_results(first.job_id)
    assert result.output_text == "abc" and result.num_output_tokens == 3


def test_expired_leases_go_back_to_waiting_and_only_the_new_holder_ends_them(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([submission(3)])
    stale = queue.claim("paused", per_group=2, lease_s=SHORT_LEASE_S)
    live = queue.claim("live", per_group=5, lease_s=60)
    assert len(stale) == 2 and len(live) == 1
    assert queue.reclaim_expired() == 0  # nothing has expired yet
    table.expire()
    assert queue.reclaim_expired() == 2  # only the expired ones, not the live daemon's
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.counts.num_running == 1 and summary.counts.num_waiting == 2
    queue.claim("live", per_group=5, lease_s=60)
    late = [Completion(c.id, RequestStatus.FINISHED_STOPPED, (9, 9), "late", lease_epoch=1) for c in stale]
    assert queue.finish_requests(late, "paused") == [False, False]
    assert queue.finish_requests(
        [Completion(c.id, RequestStatus.FINISHED_STOPPED, (1,), "ok", lease_epoch=2) for c in stale], "live"
    ) == [True, True]
    done = {r.custom_id: r.output_text for r in store.iter_results(job.job_id)}
    assert {done[c.custom_id] for c in stale} == {"ok"}
    assert store.list_jobs(job_id=job.job_id)[0].counts.num_done == 2


def test_cancelled_held_weights_and_a_heartbeat_on_the_tables_clock(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([submission(2)])
    queue.claim("d1", per_group=1)
    assert queue.has_queued()
    store.cancel_job(job.job_id)
    assert len(queue.cancelled_held("d1")) == 1 and not queue.has_queued()
    store.set_weight("alice", 3)
    assert queue.tenant_weights() == {"alice": 3.0}
    beat = DaemonSummary("d1", "host", 1, "cpu", "tiny", 1.0, 2.0, None, DaemonStats(batch=3))
    queue.heartbeat(beat)
    queue.heartbeat(DaemonSummary("d1", "host", 1, "cpu", "tiny", 1.0, 3.0, None, DaemonStats(batch=4)))
    (row,) = store.list_daemons()
    # The heartbeat is stamped by the table's clock, not the daemon's.
    assert abs(row.heartbeat_at - table.now()) < 5 and 0 <= row.heartbeat_age_s < 5
    assert row.stats == DaemonStats(batch=4)


# -- reading ----------------------------------------------------------------------------------------


def test_results_in_input_order_across_pages(table, monkeypatch):
    monkeypatch.setattr(sql_catalog, "RESULTS_BATCH", 7)
    (job,) = table.catalog.submit([submission(30)])
    claimed = table.queue.claim("d", per_group=30)
    for c in reversed(claimed):  # finish in reverse order
        finish(table.queue, c.id, RequestStatus.FINISHED_STOPPED, [1], c.custom_id)
    assert [r.custom_id for r in table.catalog.iter_results(job.job_id)] == [f"c{i}" for i in range(30)]


def test_list_jobs_filters_and_recent_finished(table):
    store = table.catalog
    ids = [j.job_id for j in store.submit([submission(1, "a"), submission(1, "b"), submission(1, "a")])]
    store.cancel_job(ids[0])
    assert [j.id for j in store.list_jobs(tenant="a")] == [ids[0], ids[2]]
    assert [j.id for j in store.list_jobs(finished_limit=0)] == ids[1:]
    assert [j.id for j in store.list_jobs(include_finished=False)] == ids[1:]
    with pytest.raises(UnknownJob):  # a job of another tenant is none of this listing's
        store.list_jobs(job_id=ids[1], tenant="a")


def test_request_progress_follows_flushes_and_the_finish(at_100):
    store, queue = at_100.catalog, at_100.queue
    (job,) = store.submit([submission(1, "alice", RequestClass.REALTIME)])
    (before,) = store.request_progress(job.job_id)
    assert (before.status, before.output_text, before.first_token_at) == (RequestStatus.WAITING, "", None)
    assert before.enqueued_at == 100.0

    (claimed,) = queue.claim("d", per_group=5)
    queue.flush_tokens("d", [TokenUpdate(claimed.id, (5, 6), "he", first_token_at=100.25)])
    (mid,) = store.request_progress(job.job_id)
    assert (mid.status, mid.output_text, mid.num_output_tokens, mid.first_token_at) == (
        RequestStatus.RUNNING, "he", 2, 100.25)

    finish(queue, claimed.id, RequestStatus.FINISHED_LENGTH, (5, 6, 7), "hey", owner="d")
    (end,) = store.request_progress(job.job_id)
    assert (end.status, end.output_text, end.num_output_tokens, end.finish_reason) == (
        RequestStatus.FINISHED_LENGTH, "hey", 3, "length")
    assert end.first_token_at == 100.25 and end.finished_at == 100.0


def test_request_timings_only_the_given_jobs_with_tenant_and_class(at_100):
    store, queue = at_100.catalog, at_100.queue
    a, b, _ = (store.submit([s])[0].job_id for s in (
        submission(2, "alice"), submission(1, "bob", RequestClass.REALTIME), submission(3, "carol")))
    claimed = {c.job_id: c for c in queue.claim("d", per_group=1)}
    queue.flush_tokens("d", [TokenUpdate(claimed[b].id, (1,), "x", first_token_at=100.5)])

    timings = store.request_timings([a, b])
    assert [(t.job_id, t.tenant, t.request_class) for t in timings] == [
        (a, "alice", RequestClass.BATCH), (a, "alice", RequestClass.BATCH), (b, "bob", RequestClass.REALTIME)]
    bob = timings[-1]
    assert (bob.first_token_at - bob.enqueued_at, bob.num_output_tokens, bob.status) == (
        0.5, 1, RequestStatus.RUNNING)
    assert all(t.first_token_at is None for t in timings[:2])
    assert store.request_timings([]) == []


def test_jobs_carry_their_origin_and_online_requests_are_grouped_per_tenant_and_key(table):
    store, queue = table.catalog, table.queue
    (file_job,) = store.submit([submission(2)])
    one = parse_job_file(b'{"prompt": "hi", "max_tokens": 4}\n', "<http>")
    online = [store.submit([JobSubmission(one, tenant, RequestClass.REALTIME, 5, "http", JobOrigin.ONLINE,
                                          key)])[0] for tenant, key in
              (("alice", "k1"), ("alice", "k1"), ("alice", "k2"), ("bob", "k3"))]
    store.submit([JobSubmission(one, "bob", RequestClass.STREAMING, 5, "generate", JobOrigin.GENERATE)])
    assert [j.id for j in store.list_jobs(interactive=False)] == [file_job.job_id]
    assert len(store.list_jobs(interactive=True)) == 5
    assert {j.origin for j in store.list_jobs()} == {JobOrigin.SUBMIT, JobOrigin.ONLINE, JobOrigin.GENERATE}
    claimed = {c.job_id: c for c in queue.claim("d", per_group=10)}
    first = claimed[online[0].job_id]
    queue.flush_tokens("d", [TokenUpdate(first.id, (1,), "x", first_token_at=table.now())])
    finish(queue, first.id, RequestStatus.FINISHED_LENGTH, [1, 2], "xy", prompt_tokens=1)
    groups = {(g.tenant, g.key_id): g for g in store.online_groups()}
    assert set(groups) == {("alice", "k1"), ("alice", "k2"), ("bob", "k3"), ("bob", None)}
    k1 = groups["alice", "k1"]
    assert (k1.requests, k1.in_flight, k1.done, k1.generated_tokens, k1.recent) == (2, 1, 1, 2, 1)
    assert k1.ttft_p50_s is not None and 0 <= k1.ttft_p50_s < 60
    assert groups["alice", "k2"].ttft_p50_s is None
    assert [g.key_id for g in store.online_groups(tenant="bob")] == [None, "k3"]


def batch(*bodies: dict) -> JobSubmission:
    lines = [json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/completions", "body": b})
             for i, b in enumerate(bodies)]
    parsed = parse_job_file(("\n".join(lines) + "\n").encode(), "f.jsonl")
    return JobSubmission(parsed, "alice", RequestClass.BATCH, 5, "job")


def finish_choices(queue, claimed, state=RequestStatus.FINISHED_STOPPED, text_of=lambda c: f"t{c.id}"):
    done = [Completion(c.id, state, (7, 8), text_of(c), 3, "m", lease_epoch=c.lease_epoch,
                       error=None if state.succeeded else "broke")
            for c in claimed]
    assert all(queue.finish_requests(done, "d"))


def test_a_line_of_n_choices_is_n_rows_and_one_output_line(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([batch({"prompt": "p", "n": 3, "seed": 5}, {"prompt": "q"})])
    assert job.num_requests == 4
    claimed = queue.claim("d", per_group=10)
    seeds = sorted(c.params.seed for c in claimed if c.custom_id == "l0")
    assert seeds == [5, 6, 7]  # choice i draws with seed + i
    finish_choices(queue, claimed)
    lines = list(lines_of(store.iter_results(job.job_id)))
    assert [[r.choice for r in line] for line in lines] == [[0, 1, 2], [0]]
    first = output_line(lines[0])
    body = first["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}
    assert list(store.iter_results(job.job_id, errors=True)) == []
    progress = table.serving.progress([job.job_id])[job.job_id]
    assert [p.choice for p in progress] == [0, 0, 1, 2] and progress[1].tokens == (7, 8)


def test_a_failed_choice_fails_its_line_and_an_unfinished_one_holds_it_back(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([batch({"prompt": "p", "n": 2}, {"prompt": ["a", "b"]}, {"prompt": "r"})])
    by_line = {}
    for c in queue.claim("d", per_group=10):
        by_line.setdefault(c.custom_id, []).append(c)
    finish_choices(queue, [by_line["l0"][0], by_line["l2"][0]])
    finish_choices(queue, [by_line["l0"][1]], RequestStatus.FINISHED_FAILED)
    finish_choices(queue, [by_line["l1"][0]])  # its second prompt's choice still runs
    assert [r.custom_id for r in store.iter_results(job.job_id)] == ["l2"]
    errors = list(lines_of(store.iter_results(job.job_id, errors=True)))
    assert [[r.choice for r in line] for line in errors] == [[0, 1]]
    assert output_line(errors[0])["error"] == {"code": "request_failed", "message": "broke"}
    finish_choices(queue, [by_line["l1"][1]])
    assert [r.custom_id for r in store.iter_results(job.job_id)] == ["l1", "l1", "l2"]


# -- tenants ------------------------------------------------------------------------------------------


def test_tenants_add_reweight_remove(table):
    store = table.catalog
    store.add_tenant("alice", 3)
    with pytest.raises(TenantExists):
        store.add_tenant("alice")
    with pytest.raises(ValueError):
        store.add_tenant("bob", 0)
    store.set_weight("alice", 0.5)
    assert store.list_tenants()[0].weight == 0.5
    with pytest.raises(UnknownTenant):
        store.set_weight("nobody", 2)
    (job,) = store.submit([submission(1, "alice")])
    with pytest.raises(TenantBusy, match="1 unfinished job"):
        store.remove_tenant("alice")
    store.cancel_job(job.job_id)
    store.remove_tenant("alice")
    assert store.list_tenants() == []
    assert store.list_jobs()[0].tenant == "alice"  # history stays
    with pytest.raises(UnknownTenant):
        store.remove_tenant("alice")
