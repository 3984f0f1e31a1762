"""The QueueStore contract, one set of tests run on every implementation: in memory, SQLite, PostgreSQL.

Each test states a rule of `core/ports/queue.py`'s contract; the in-memory
store (what the daemon's unit tests run on) is held to the same rules as
the SQL one the daemons use.
"""

from __future__ import annotations

import json

import pytest

from fsched.core.ports.queue import QueueStore
from fsched.core.ports.records import Completion, StoreError, TokenUpdate
from fsched.core.types import RequestClass, RequestStatus
from tests.support.store import finish
from tests.support.tables import KINDS, SHORT_LEASE_S, open_table


@pytest.fixture(params=KINDS)
def table(request):
    made = open_table(request, request.param)
    yield made
    made.close()


def test_it_is_a_queue_store(table):
    assert isinstance(table.queue, QueueStore)


def test_claims_are_fair_per_group_capped_and_never_twice(table):
    q = table.queue
    table.submit(50, "big")
    table.submit(3, "small")
    table.submit(4, "big", RequestClass.REALTIME)
    claimed = q.claim("d", per_group=5)
    groups: dict = {}
    for c in claimed:
        groups.setdefault((c.tenant, c.request_class), []).append(c.custom_id)
    assert groups == {
        ("big", RequestClass.BATCH): ["c0", "c1", "c2", "c3", "c4"],
        ("small", RequestClass.BATCH): ["c0", "c1", "c2"],
        ("big", RequestClass.REALTIME): ["c0", "c1", "c2", "c3"],
    }
    assert all(isinstance(c.id, str) for c in claimed)  # the core's one id type
    more = q.claim("e", per_group=7, held={("big", RequestClass.BATCH): 5}, limit=100)
    assert [c.custom_id for c in more] == ["c5", "c6"]
    rest = q.claim("e", per_group=100, limit=10)
    assert len(rest) == 10
    ids = [c.id for c in [*claimed, *more, *rest]]
    assert len(ids) == len(set(ids))  # no request in two claims


def test_a_claim_raises_the_epoch_and_stale_epochs_write_nothing(table):
    q = table.queue
    job = table.submit(1)
    (first,) = q.claim("d1", per_group=5, lease_s=30)
    assert (first.lease_epoch, first.attempts) == (1, 1)
    assert q.renew_leases("d1", {first.id: 1}, lease_s=30) == {first.id}
    assert q.renew_leases("d1", {first.id: 0}, lease_s=30) == set()
    assert q.release("d1") == 1
    (second,) = q.claim("d1", per_group=5, lease_s=30)  # the same owner, a new lease
    assert (second.id, second.lease_epoch, second.attempts) == (first.id, 2, 2)
    assert q.flush_tokens("d1", [TokenUpdate(first.id, (1, 2), "ab", lease_epoch=1)]) == 0
    stale = Completion(first.id, RequestStatus.FINISHED_STOPPED, (1,), "a", lease_epoch=1)
    assert q.finish_requests([stale], "d1") == [False]
    assert table.view(job)[first.id] == (RequestStatus.RUNNING, "", 0)
    assert q.flush_tokens("d1", [TokenUpdate(first.id, (1, 2), "ab", lease_epoch=2)]) == 1
    done = Completion(first.id, RequestStatus.FINISHED_STOPPED, (1, 2, 3), "abc", lease_epoch=2)
    assert q.finish_requests([done], "d1") == [True]
    assert table.view(job)[first.id] == (RequestStatus.FINISHED_STOPPED, "abc", 3)


def test_jobs_of_one_come_in_the_claims_order_with_their_job_and_their_tokens(table):
    """A job of one request (every online request) is leased by one statement that returns its row: it
    comes in the claim's order among a bigger job's requests (priority, then age), with its job's
    tenant, class and priority, the lease's epoch and attempts, and on a resume its tokens."""
    from dataclasses import replace

    from tests.support.tables import submission

    q = table.queue
    (stored,) = table.catalog.submit([replace(submission(1, "bob", RequestClass.STREAMING), priority=2)])
    urgent = stored.job_id
    first = table.submit(1, "alice", RequestClass.REALTIME)
    big = table.submit(3, "alice", RequestClass.REALTIME)
    last = table.submit(1, "alice", RequestClass.REALTIME)
    claimed = q.claim("d1", per_group=10)
    assert [c.job_id for c in claimed] == [urgent, first, big, big, big, last]
    assert [(c.tenant, c.request_class, c.priority) for c in claimed[:2]] == [
        ("bob", RequestClass.STREAMING, 2), ("alice", RequestClass.REALTIME, 5)]
    assert [(c.lease_epoch, c.attempts) for c in claimed] == [(1, 1)] * 6
    assert q.flush_tokens("d1", [TokenUpdate(claimed[1].id, (5, 6), "xy", lease_epoch=1)]) == 1
    assert q.release("d1") == 6
    again = q.claim("d2", per_group=10)
    assert [(c.id, c.lease_epoch, c.attempts) for c in again] == [(c.id, 2, 2) for c in claimed]
    assert (again[1].resumed, again[0].resumed) == ([5, 6], [])
    assert q.flush_tokens("d1", [TokenUpdate(again[1].id, (7,), "z", lease_epoch=1)]) == 0
    assert q.flush_tokens("d2", [TokenUpdate(again[1].id, (7,), "z", lease_epoch=2)]) == 1


def test_another_owner_writes_nothing_and_nothing_ends_twice(table):
    q = table.queue
    job = table.submit(2)
    a, b = q.claim("d1", per_group=5)
    assert q.flush_tokens("intruder", [TokenUpdate(a.id, (9,), "x")]) == 0
    assert not finish(q, a.id, RequestStatus.FINISHED_STOPPED, [9], "x", owner="intruder")
    assert finish(q, a.id, RequestStatus.FINISHED_STOPPED, [1], "ok", owner="d1", lease_epoch=a.lease_epoch)
    assert not finish(q, a.id, RequestStatus.FINISHED_FAILED, error="late")  # ended already
    assert q.finish_requests([Completion(b.id, RequestStatus.FINISHED_FAILED, error="boom")]) == [True]
    view = table.view(job)
    assert view[a.id] == (RequestStatus.FINISHED_STOPPED, "ok", 1)
    assert view[b.id][0] is RequestStatus.FINISHED_FAILED
    with pytest.raises(ValueError):
        finish(q, b.id, RequestStatus.RUNNING)
    with pytest.raises(StoreError, match="no request"):
        finish(q, "999999", RequestStatus.FINISHED_STOPPED)


def test_released_requests_resume_with_their_tokens(table):
    q = table.queue
    table.submit(3)
    a, b, c = q.claim("d1", per_group=10)
    updates = [TokenUpdate(a.id, (5, 6), "xy", lease_epoch=1), TokenUpdate(b.id, (7,), "z")]
    assert q.flush_tokens("d1", updates) == 2
    assert q.release("d1", [b.id]) == 1
    (again,) = q.claim("d2", per_group=10)
    assert (again.id, again.resumed) == (b.id, [7])
    assert q.release() == 3  # everything running, whoever holds it
    assert q.has_queued() and not q.cancelled_held("d1")
    resumed = {x.id: x.resumed for x in q.claim("d3", per_group=10)}
    assert resumed == {a.id: [5, 6], b.id: [7], c.id: []}


def test_expired_leases_are_reclaimed_and_the_old_holder_is_fenced(table):
    q = table.queue
    job = table.submit(3)
    stale = q.claim("paused", per_group=2, lease_s=SHORT_LEASE_S)
    (live,) = q.claim("live", per_group=5, lease_s=60)
    assert q.flush_tokens("paused", [TokenUpdate(stale[0].id, (7,), "x", lease_epoch=1)]) == 1
    assert q.reclaim_expired() == 0
    table.expire()
    assert q.reclaim_expired() == 2  # only the expired ones
    taken = {c.id: c for c in q.claim("live", per_group=5, lease_s=60)}
    assert set(taken) == {c.id for c in stale}
    assert (taken[stale[0].id].resumed, taken[stale[0].id].lease_epoch) == ([7], 2)
    assert q.renew_leases("paused", {c.id: 1 for c in stale}, lease_s=60) == set()
    assert q.flush_tokens("paused", [TokenUpdate(c.id, (9, 9), "late", lease_epoch=1) for c in stale]) == 0
    late = [Completion(c.id, RequestStatus.FINISHED_STOPPED, (9,), "late", lease_epoch=1) for c in stale]
    assert q.finish_requests(late, "paused") == [False, False]
    assert q.renew_leases("live", {live.id: 1, **{c.id: 2 for c in stale}}, lease_s=60) == {
        live.id, *(c.id for c in stale)}
    assert all(state is RequestStatus.RUNNING for state, _, _ in table.view(job).values())


def test_completions_written_together_each_end_their_own_request_around_a_fenced_one(table):
    """One write of three completions, the middle one under a lease epoch it lost: the other two end
    with their own tokens and text (SQLite makes the rows before its transaction and writes those the
    fencing lets through), the middle one stays as its holder left it."""
    q = table.queue
    job = table.submit(3)
    claimed = q.claim("d1", per_group=5, lease_s=60)
    ends = [Completion(c.id, RequestStatus.FINISHED_STOPPED, tuple(range(i + 1)), f"text {i}",
                       lease_epoch=c.lease_epoch + (i == 1)) for i, c in enumerate(claimed)]
    assert q.finish_requests(ends, "d1") == [True, False, True]
    view = table.view(job)
    assert [view[c.id] for c in claimed] == [(RequestStatus.FINISHED_STOPPED, "text 0", 1),
                                             (RequestStatus.RUNNING, "", 0),
                                             (RequestStatus.FINISHED_STOPPED, "text 2", 3)]


def test_a_cancelled_job_is_never_claimed_and_its_held_requests_end(table):
    q = table.queue
    job = table.submit(4)
    held = q.claim("d1", per_group=2)
    other = table.submit(1, "bob")
    table.cancel(job)
    assert sorted(q.cancelled_held("d1")) == sorted(c.id for c in held)
    assert [c.job_id for c in q.claim("d1", per_group=10)] == [other]  # nothing of the cancelled job
    assert q.release("d1", [c.id for c in held]) == 2
    view = table.view(job)
    # handed back: ended
    assert {state for state, _, _ in view.values()} == {RequestStatus.FINISHED_CANCELLED}
    assert not q.has_queued()


def test_usage_exchange_shows_only_the_other_daemons(table):
    q = table.queue
    assert q.exchange_usage("a", {"alice": (2.0, 100.0)}) == []
    peers = q.exchange_usage("b", {"bob": (1.0, 10.0)})
    assert [(p.daemon, p.tenant, p.gpu_s, p.kv_token_s) for p in peers] == [("a", "alice", 2.0, 100.0)]
    assert 0 <= peers[0].age_s < 5
    q.exchange_usage("a", {"alice": (3.0, 0.0), "bob": (0.5, 0.0)})
    assert sorted((p.daemon, p.tenant, p.gpu_s) for p in q.exchange_usage("b", {})) == [
        ("a", "alice", 3.0), ("a", "bob", 0.5)]


def test_weights_and_has_queued(table):
    q = table.queue
    assert not q.has_queued(running_too=True)
    table.submit(1)
    table.set_weight("alice", 3)
    assert q.tenant_weights() == {"alice": 3.0}
    assert q.has_queued()
    q.claim("d", per_group=1)
    assert not q.has_queued() and q.has_queued(running_too=True)


def test_a_finish_names_a_final_state_and_a_known_request(table):
    job = table.submit(1)
    (request_id,) = table.view(job)
    with pytest.raises(ValueError):
        finish(table.queue, request_id, RequestStatus.RUNNING)
    with pytest.raises(StoreError, match="no request"):
        finish(table.queue, "999", RequestStatus.FINISHED_STOPPED)


def test_a_claim_carries_the_chat_templates_tools_and_options(table):
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
            "tools": tools, "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 4}
    data = json.dumps(line) + "\n" + json.dumps({"prompt": "p", "max_tokens": 4}) + "\n"
    specs = parse_job_file(data.encode(), "f.jsonl")
    table.catalog.submit([JobSubmission(specs, "alice", RequestClass.BATCH, 5, "tools")])
    with_tools, plain = sorted(table.queue.claim("d", per_group=5), key=lambda c: c.prompt_text is not None)
    assert with_tools.render == {"tools": tools, "kwargs": {"enable_thinking": False}}
    assert with_tools.messages[1]["tool_calls"][0]["function"]["name"] == "f"
    assert with_tools.messages[2]["tool_call_id"] == "c1" and plain.render is None
