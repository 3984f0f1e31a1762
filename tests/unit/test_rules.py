"""Small pure rules: job state, entitled shares, tenant names and weights, output lines."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsched.core.jobs.jobstate import JobCounts, derive_job_state
from fsched.core.jobs.tenants import validate_tenant_name, validate_weight
from fsched.core.openai.results import output_line
from fsched.core.ports.records import RequestResult
from fsched.core.sched.shares import entitled_shares
from fsched.core.types import JobState, RequestStatus, SamplingParams


@pytest.mark.parametrize(
    ("counts", "started", "cancel", "expected"),
    [
        (JobCounts(3), False, False, JobState.QUEUED),
        (JobCounts(3, num_running=1), True, False, JobState.IN_PROGRESS),
        (JobCounts(3, num_done=1), True, False, JobState.IN_PROGRESS),
        (JobCounts(3, num_done=2, num_failed=1), True, False, JobState.COMPLETED),
        (JobCounts(3, num_failed=3), True, False, JobState.FAILED),
        (JobCounts(3, num_cancelled=2, num_running=1), True, True, JobState.CANCELLING),
        (JobCounts(3, num_cancelled=2, num_done=1), True, True, JobState.CANCELLED),
        (JobCounts(3, num_cancelled=3), False, True, JobState.CANCELLED),
    ],
)
def test_job_state(counts, started, cancel, expected):
    assert derive_job_state(counts, started=started, cancel_requested=cancel) is expected


def test_finished_is_a_property():
    assert JobState.CANCELLED.finished and not JobState.CANCELLING.finished
    assert RequestStatus.FINISHED_STOPPED.is_finished and not RequestStatus.PREEMPTED.is_finished
    assert RequestStatus.PREEMPTED.is_waiting and not RequestStatus.RUNNING.is_waiting
    # One order, as a request lives it: waiting < running < preempted < finished (why, in the status).
    assert RequestStatus.WAITING < RequestStatus.RUNNING < RequestStatus.PREEMPTED
    assert RequestStatus.PREEMPTED < min(s for s in RequestStatus if s.is_finished)
    assert all(s.is_finished for s in RequestStatus if s > RequestStatus.PREEMPTED)
    assert [s.finish_reason for s in RequestStatus if s.succeeded] == ["stop", "length"]
    assert RequestStatus.FINISHED_FAILED.finish_reason is None and not RequestStatus.FINISHED_FAILED.succeeded
    assert RequestStatus.finished_by("length") is RequestStatus.FINISHED_LENGTH
    assert RequestStatus.finished_by("abort") is RequestStatus.FINISHED_STOPPED  # an engine's other words
    assert all(RequestStatus.of_word(s.word) is s for s in RequestStatus)


def test_entitled_shares_active_sum_to_one_and_idle_shows_would_be_share():
    shares = entitled_shares({"a": 3, "b": 1, "c": 4}, active={"a", "b"})
    assert shares["a"] == pytest.approx(0.75) and shares["b"] == pytest.approx(0.25)
    assert shares["c"] == pytest.approx(4 / 8)


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.floats(0.01, 1000), min_size=1, max_size=8))
def test_entitled_shares_of_all_active_sum_to_one(weights):
    assert math.isclose(sum(entitled_shares(weights, weights).values()), 1.0)


@pytest.mark.parametrize("weight", [0, -1, float("nan"), float("inf"), 1e9, True, "2"])
def test_bad_weights_are_refused(weight):
    with pytest.raises(ValueError):
        validate_weight(weight)


def test_good_weights_and_names():
    assert validate_weight(3) == 3.0 and validate_weight(0.5) == 0.5
    assert validate_tenant_name("alice@team-1.x") == "alice@team-1.x"
    for bad in ["", " alice", "a b", "-x", "x" * 129, "é"]:
        with pytest.raises(ValueError):
            validate_tenant_name(bad)


def test_sampling_params_validate_and_round_trip():
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=40, seed=3, stop=("x",))
    assert SamplingParams.from_json(params.to_json()) == params
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)


def result(state, endpoint="/v1/completions", **kw):
    base = dict(
        id=7,
        idx=0,
        custom_id="c1",
        endpoint=endpoint,
        status=state,
        model="tiny",
        output_text="hello",
        num_output_tokens=2,
        prompt_tokens=5,
        error=None,
        finished_at=1700000000.5,
    )
    return RequestResult(**{**base, **kw})


def test_output_lines_follow_the_openai_batch_shape():
    done = output_line(result(RequestStatus.FINISHED_LENGTH))
    assert done["custom_id"] == "c1" and done["error"] is None
    body = done["response"]["body"]
    assert done["response"]["status_code"] == 200
    assert body["choices"][0]["text"] == "hello" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    chat = output_line(result(RequestStatus.FINISHED_LENGTH, endpoint="/v1/chat/completions"))
    assert chat["response"]["body"]["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    failed = output_line(result(RequestStatus.FINISHED_FAILED, error="prompt too long"))
    assert failed["response"] is None and failed["error"]["message"] == "prompt too long"
    assert output_line(result(RequestStatus.FINISHED_CANCELLED))["error"]["code"] == "cancelled"
