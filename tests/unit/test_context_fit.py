"""prompt + max_tokens against the model's context, at admission (the OpenAI/vLLM convention)."""

from __future__ import annotations

import pytest

from fsched.core.daemon.engine import ContextOverflow, Engine, fit_to_context
from fsched.core.runners.standin import StandInRunner
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestStatus, SamplingParams

ASKED = SamplingParams(max_tokens=50)
DEFAULT = SamplingParams(max_tokens=50, max_tokens_is_default=True)


def test_fit_to_context_rules():
    assert fit_to_context(10, 0, ASKED, 60) == 50  # exactly fills the context: fine
    assert fit_to_context(10, 0, DEFAULT, 100) == 50  # a default that fits is kept
    assert fit_to_context(80, 0, DEFAULT, 100) == 20  # a default is capped at the room left
    with pytest.raises(ContextOverflow) as info:
        fit_to_context(11, 0, ASKED, 60)
    assert str(info.value) == (
        "the prompt (11 tokens) plus max_tokens (50) is 61 tokens, over the model's context of 60; "
        "lower max_tokens to at most 49 or shorten the prompt"
    )
    for params in (ASKED, DEFAULT):  # a prompt that fills the context can never run
        with pytest.raises(ContextOverflow, match="the prompt is 100 tokens; the model's context holds 100"):
            fit_to_context(100, 0, params, 100)
    with pytest.raises(ContextOverflow):  # resumed: prompt plus the tokens so far fill it
        fit_to_context(60, 40, DEFAULT, 100)


def test_engine_fails_an_over_long_request_alone_and_caps_a_default():
    context = 64
    engine = Engine(
        StandInRunner(context_length=context), Scheduler(SchedulerConfig(max_batch=8), "fcfs"), context
    )
    requests = [
        Request.to_run("asked", [7] * 40, SamplingParams(max_tokens=30, temperature=0)),
        Request.to_run(
            "default", [7] * 40, SamplingParams(max_tokens=256, temperature=0, max_tokens_is_default=True)
        ),
        Request.to_run("fits", [7] * 40, SamplingParams(max_tokens=24, temperature=0)),
    ]
    results = engine.run_all(requests)
    assert results["asked"].status is RequestStatus.FINISHED_FAILED
    assert results["asked"].error == (
        "the prompt (40 tokens) plus max_tokens (30) is 70 tokens, over the model's context of 64; "
        "lower max_tokens to at most 24 or shorten the prompt"
    )
    assert results["default"].error is None and len(results["default"].tokens) <= 24
    assert results["fits"].error is None and results["fits"].tokens
    assert results["default"].tokens == results["fits"].tokens[: len(results["default"].tokens)]


def test_stored_params_keep_the_flag_and_old_rows_stay_capped():
    assert SamplingParams.from_json(DEFAULT.to_json()) == DEFAULT
    assert SamplingParams.from_json(ASKED.to_json()) == ASKED
    old_row = {"max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 1, "stop": []}
    assert SamplingParams.from_json(old_row).max_tokens_is_default  # stored before the check existed


def test_engine_counts_first_tokens_on_target_per_tenant_and_class_from_their_enqueueing():
    """A first token counts on target when it comes within the class's target of the request's
    enqueueing (its time in the table counts); a resumed request, its first token already out, is
    not counted again."""
    from fsched.core.types import RequestClass

    clock = [100.0]
    config = SchedulerConfig(max_batch=8)
    engine = Engine(StandInRunner(context_length=256), Scheduler(config, "fcfs"), 256, clock=lambda: clock[0])
    params = SamplingParams(max_tokens=3, temperature=0)
    rt, ba = RequestClass.REALTIME, RequestClass.BATCH
    engine.add(Request.to_run("quick", [7] * 8, params, "a", rt), queued_s=0.1)
    engine.add(Request.to_run("queued-long", [7] * 8, params, "a", rt), queued_s=10.0)
    engine.add(Request.to_run("batch", [7] * 8, params, "b", ba), queued_s=5.0)
    engine.add(Request.to_run("resumed", [7] * 8, params, "b", ba, resumed=[7]))
    clock[0] = 100.2
    while engine.has_work:
        engine.step()
    assert engine.first_tokens.to_json() == {"a": {"realtime": [2, 1]}, "b": {"batch": [1, 1]}}
    assert engine.snapshot().first_tokens == engine.first_tokens.to_json()
    assert engine.snapshot().work.computed > 0
