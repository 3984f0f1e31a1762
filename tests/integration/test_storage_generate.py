"""The reads `fsched generate` and `fsched demo` poll: one request's progress, latency timings."""

from __future__ import annotations

import json

import pytest

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission, TokenUpdate, UnknownJob
from fsched.core.types import RequestClass, RequestState
from fsched.storage.jobstore import SqlJobStore
from tests.support.store import finish


def submit(store: SqlJobStore, n: int, tenant: str, request_class: RequestClass) -> int:
    data = "".join(json.dumps({"prompt": f"p{i}", "max_tokens": 4}) + "\n" for i in range(n))
    (job,) = store.submit([JobSubmission(parse_job_file(data.encode(), "f"), tenant, request_class, 5, "j")])
    return job.job_id


@pytest.fixture
def store(db_url) -> SqlJobStore:
    store = SqlJobStore(db_url, clock=lambda: 100.0)
    yield store
    store.db.dispose()


def test_request_progress_follows_flushes_and_the_finish(store):
    job_id = submit(store, 1, "alice", RequestClass.REALTIME)
    (before,) = store.request_progress(job_id)
    assert (before.state, before.output_text, before.first_token_at) == (RequestState.QUEUED, "", None)
    assert before.enqueued_at == 100.0

    (claimed,) = store.claim("d", per_group=5)
    store.flush_tokens("d", [TokenUpdate(claimed.id, (5, 6), "he", first_token_at=100.25)])
    (mid,) = store.request_progress(job_id)
    assert (mid.state, mid.output_text, mid.num_output_tokens, mid.first_token_at) == (
        RequestState.RUNNING, "he", 2, 100.25)

    finish(store, claimed.id, RequestState.DONE, (5, 6, 7), "hey", finish_reason="length", owner="d")
    (end,) = store.request_progress(job_id)
    assert (end.state, end.output_text, end.num_output_tokens, end.finish_reason) == (
        RequestState.DONE, "hey", 3, "length")
    assert end.first_token_at == 100.25 and end.finished_at == 100.0


def test_request_progress_of_an_unknown_job_raises(store):
    with pytest.raises(UnknownJob):
        store.request_progress(42)


def test_request_timings_only_the_given_jobs_with_tenant_and_class(store):
    a = submit(store, 2, "alice", RequestClass.BATCH)
    b = submit(store, 1, "bob", RequestClass.REALTIME)
    submit(store, 3, "carol", RequestClass.BATCH)
    claimed = {c.job_id: c for c in store.claim("d", per_group=1)}
    store.flush_tokens("d", [TokenUpdate(claimed[b].id, (1,), "x", first_token_at=100.5)])

    timings = store.request_timings([a, b])
    assert [(t.job_id, t.tenant, t.request_class) for t in timings] == [
        (a, "alice", RequestClass.BATCH), (a, "alice", RequestClass.BATCH), (b, "bob", RequestClass.REALTIME)]
    bob = timings[-1]
    assert (bob.first_token_at - bob.enqueued_at, bob.num_output_tokens, bob.state) == (
        0.5, 1, RequestState.RUNNING)
    assert all(t.first_token_at is None for t in timings[:2])
    assert store.request_timings([]) == []
