"""`fsched demo`'s summary is pure: percentiles, the backlogged window's shares, per class and tenant."""

from __future__ import annotations

import pytest

from fsched.cli.demo import ShareWindow, percentile, summary
from fsched.core.jobs.jobstate import JobCounts, JobSummary
from fsched.core.ports.records import RequestTiming
from fsched.core.types import JobState, RequestClass, RequestStatus


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0, 1.0, 3.0], 50) == 3.0 and percentile([7.0, 1.0, 3.0], 99) == 7.0
    assert percentile([], 50) is None


def jobs(alice: int, bob: int, bob_batch_done: bool = False) -> list[JobSummary]:
    def job(id, tenant, request_class, tokens, finished=False):
        state = JobState.COMPLETED if finished else JobState.IN_PROGRESS
        return JobSummary(id, tenant, request_class, 5, "j", state, JobCounts(10), tokens, 0.0, 0.0, None)

    return [job(1, "alice", RequestClass.BATCH, alice),
            job(2, "bob", RequestClass.BATCH, bob, bob_batch_done),
            job(3, "bob", RequestClass.REALTIME, 0, True)]


def test_share_window_counts_only_while_both_tenants_have_batch_work():
    w = ShareWindow()
    w.observe(0.0, jobs(0, 0), None)  # nothing served yet: not warmed up
    w.observe(1.0, jobs(100, 40), {"alice": 0.7, "bob": 0.3})  # the window starts here
    w.observe(5.0, jobs(400, 140), {"alice": 0.74, "bob": 0.26})
    w.observe(9.0, jobs(700, 240, bob_batch_done=True), {"alice": 0.5, "bob": 0.5})  # bob done: ignored
    seconds, shares = w.shares()
    assert seconds == 4.0
    assert shares == pytest.approx({"alice": 0.75, "bob": 0.25})
    assert w.daemon_share == {"alice": 0.74, "bob": 0.26}
    assert ShareWindow().shares() == (0.0, {})


def timing(id, tenant, request_class, tokens, ttft_s):
    return RequestTiming(id, 1, tenant, request_class, RequestStatus.FINISHED_STOPPED, tokens, 100.0,
                         None if ttft_s is None else 100.0 + ttft_s, 120.0)


def test_summary_per_class_latency_and_per_tenant_shares():
    timings = [timing(1, "bob", RequestClass.REALTIME, 32, 0.05),
               timing(2, "bob", RequestClass.REALTIME, 32, 0.2),
               timing(3, "alice", RequestClass.BATCH, 96, 3.0),
               timing(4, "alice", RequestClass.BATCH, 96, 9.0),
               timing(5, "bob", RequestClass.BATCH, 0, None)]
    w = ShareWindow()
    w.observe(1.0, jobs(10, 10), None)
    w.observe(3.0, jobs(160, 60), {"alice": 0.73, "bob": 0.27})
    s = summary(timings, w, "fsched", startup_s=5.04, serve_s=10.0)
    assert s["classes"]["realtime"] == {"requests": 2, "done": 2, "tokens": 64, "ttft_p50_ms": 50.0,
                                        "ttft_p99_ms": 200.0}
    assert s["classes"]["batch"]["ttft_p50_ms"] == 3000.0 and s["classes"]["batch"]["requests"] == 3
    assert "streaming" not in s["classes"]
    assert (s["requests"], s["tokens"], s["tok_s"]) == (5, 256, 25.6)
    assert (s["startup_s"], s["contended_s"]) == (5.0, 2.0)
    alice, bob = s["tenants"]["alice"], s["tenants"]["bob"]
    assert (alice["tokens"], alice["token_share"], alice["entitled_share"]) == (192, 0.75, 0.75)
    assert (bob["tokens"], bob["token_share"], bob["entitled_share"]) == (64, 0.25, 0.25)
    assert alice["contended_token_share"] == 0.75 and bob["daemon_served_share"] == 0.27
