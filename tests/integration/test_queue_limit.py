"""Queued requests per tenant: a submit over the limit is refused whole, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission, QueueFull
from fsched.core.types import RequestClass
from fsched.storage.jobstore import SqlJobStore


def submission(n: int, tenant: str = "alice") -> JobSubmission:
    data = "".join(json.dumps({"prompt": f"p{i}", "max_tokens": 4}) + "\n" for i in range(n))
    return JobSubmission(parse_job_file(data.encode(), "f.jsonl"), tenant, RequestClass.BATCH, 5, "job")


@pytest.fixture
def store(db_url) -> SqlJobStore:
    store = SqlJobStore(db_url)
    yield store
    store.db.dispose()


def queued(store: SqlJobStore) -> dict[str, int]:
    return {t.name: t.queued + t.running for t in store.list_tenants()}


def test_a_submit_over_the_limit_is_refused_whole(store):
    store.submit([submission(6)], max_queued_per_tenant=10)
    store.submit([submission(4)], max_queued_per_tenant=10)  # exactly at the limit: fine
    with pytest.raises(QueueFull) as info:
        # Several files in one submit count together; bob's file is refused with alice's.
        store.submit([submission(1, "bob"), submission(1)], max_queued_per_tenant=10)
    assert str(info.value) == (
        "tenant 'alice' has 10 unfinished request(s); 1 more would go over the limit of 10 a tenant "
        "(FSCHED_MAX_QUEUED_PER_TENANT); nothing was submitted"
    )
    assert queued(store) == {"alice": 10}
    assert len(store.list_jobs()) == 2 and "bob" not in queued(store)  # not even bob's tenant row
    store.submit([submission(10, "bob")], max_queued_per_tenant=10)  # the limit is per tenant


def test_finished_requests_free_room_and_running_ones_do_not(store):
    (first,) = store.submit([submission(5)], max_queued_per_tenant=8)
    claimed = store.claim("d1", per_group=2)
    assert len(claimed) == 2
    with pytest.raises(QueueFull):  # 5 unfinished (2 of them running) + 4 > 8
        store.submit([submission(4)], max_queued_per_tenant=8)
    store.cancel_job(first.job_id)  # the 3 waiting ones end now; the 2 running ones still count
    store.submit([submission(6)], max_queued_per_tenant=8)
    with pytest.raises(QueueFull, match="has 8 unfinished"):
        store.submit([submission(1)], max_queued_per_tenant=8)


def test_concurrent_submits_cannot_both_slip_under_the_limit(store, db_url):
    store.submit([submission(1)], max_queued_per_tenant=10)  # the tenant row exists: it is locked
    results: list[str] = []
    start = threading.Barrier(4)

    def submit_six() -> None:
        mine = SqlJobStore(db_url)
        start.wait()
        try:
            mine.submit([submission(6)], max_queued_per_tenant=10)
            results.append("ok")
        except QueueFull:
            results.append("full")
        finally:
            mine.db.dispose()

    threads = [threading.Thread(target=submit_six) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["full", "full", "full", "ok"]
    assert queued(store) == {"alice": 7}


def test_a_group_commit_stores_each_job_on_its_own_terms(store):
    store.submit([submission(8)], max_queued_per_tenant=10)
    outcomes = store.submit_each([submission(1), submission(1, "bob"), submission(2), submission(1)],
                                 max_queued_per_tenant=10)
    first, bob, over, last = outcomes
    assert first.tenant == "alice" and bob.tenant == "bob" and bob.tenant_created  # stored, in order
    assert isinstance(over, QueueFull) and over.tenant == "alice"  # 9 + 2 > 10: this one alone
    assert last.tenant == "alice" and last.job_id > bob.job_id > first.job_id  # 9 + 1 fits
    assert queued(store) == {"alice": 10, "bob": 1}
    assert len([j for j in store.list_jobs() if j.tenant == "alice"]) == 3
