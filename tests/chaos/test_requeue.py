"""Requeueing the requests of a cancelled job ends them (storage, both backends).

A daemon that dies, stops or fails a step before it sees a cancel hands its
requests back; those of a cancelled job must end `cancelled`, since no daemon
claims work of a cancelled job (the acceptance side of this is
test_kill_points.py::test_a_job_cancelled_while_its_daemon_is_stuck_ends_cancelled).
"""

from __future__ import annotations

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission
from fsched.core.types import JobState, RequestClass
from fsched.storage.jobstore import SqlJobStore


def _job(store: SqlJobStore, n: int) -> int:
    data = "".join(f'{{"prompt": "p {i}", "seed": {i}}}\n' for i in range(n)).encode()
    parsed = parse_job_file(data, "job.jsonl")
    return store.submit([JobSubmission(parsed, "t", RequestClass.BATCH, 5, "job")])[0].job_id


def test_release_after_a_cancel_ends_the_held_requests(db_url):
    store = SqlJobStore(db_url)
    cancelled, other = _job(store, 3), _job(store, 2)
    held = store.claim("d1", per_group=4)
    assert len(held) == 4  # 3 of the first job, 1 of the other
    outcome = store.cancel_job(cancelled)
    assert (outcome.state, outcome.stopping) == (JobState.CANCELLING, 3)
    assert store.release("d1") == 4
    (job,) = store.list_jobs(cancelled)
    assert job.state is JobState.CANCELLED
    assert (job.counts.num_cancelled, job.counts.num_running) == (3, 0)
    (kept,) = store.list_jobs(other)
    assert kept.state is not JobState.CANCELLED and kept.counts.num_running == 0
    assert [c.job_id for c in store.claim("d2", per_group=10)] == [other, other]  # the rest is claimable


def test_an_expired_lease_of_a_cancelled_job_ends_cancelled(db_url):
    store = SqlJobStore(db_url)
    job_id = _job(store, 2)
    store.claim("dead", per_group=2, lease_s=0.001)
    store.cancel_job(job_id)
    import time

    time.sleep(0.05)
    assert store.reclaim_expired() == 2
    (job,) = store.list_jobs(job_id)
    assert job.state is JobState.CANCELLED and job.counts.num_cancelled == 2
    assert not store.has_queued()
