"""Prefill chunks of one step: by rank within the budget, and a step that yields a due first
token carrying nothing after it."""

from __future__ import annotations

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.planning import split_rows
from fsched.core.sched.policy import make_policy
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass

RT, ST, BA = RequestClass.REALTIME, RequestClass.STREAMING, RequestClass.BATCH


def running(rid: str, request_class: RequestClass, prompt: int, arrival: float = 0.0) -> Request:
    r = Request(rid, "a", request_class, prompt, 10, arrival)
    r.deadline = arrival + SchedulerConfig().target_s(request_class)
    return r


def test_a_chunk_completing_a_due_prefill_ends_the_steps_prefill():
    rt, batch = running("rt", RT, 100), running("batch", BA, 1_500)
    order = {"rt": 0, "batch": 1}
    rank = lambda r: (order[r.id],)  # noqa: E731
    _, chunks = split_rows([rt, batch], rank, budget=2_048, min_quantum=16)
    assert [(c.request_id, c.tokens) for c in chunks] == [("rt", 100), ("batch", 1_500)]
    _, chunks = split_rows([rt, batch], rank, budget=2_048, min_quantum=16, due=lambda r: r.id == "rt")
    assert [(c.request_id, c.tokens, c.produces_token) for c in chunks] == [("rt", 100, True)]
    # a due request whose prefill this step does not complete leaves the budget to the rest
    long_rt = running("rt", RT, 3_000)
    _, chunks = split_rows([long_rt, batch], rank, budget=2_048, min_quantum=16, due=lambda r: True)
    assert [(c.request_id, c.tokens) for c in chunks] == [("rt", 2_048)]


def test_fsched_holds_a_step_short_only_for_a_realtime_first_token_still_on_target():
    policy = make_policy("fsched", SchedulerConfig(), {"a": 1})
    rt, st, batch = running("rt", RT, 100), running("st", ST, 100), running("batch", BA, 100)
    assert policy.due(rt, 0.2) and not policy.due(st, 1.5)  # streaming: a dozen steps to its target
    assert not policy.due(rt, 0.6)  # past its target: the step is filled as usual
    assert not policy.due(batch, 1.0)
    rt.generated = 1  # a resumed request's first token is out
    assert not policy.due(rt, 0.2)
    assert not make_policy("priority", SchedulerConfig(), {"a": 1}).due(running("rt2", RT, 100), 0.2)


def test_the_step_that_yields_a_realtime_first_token_carries_no_batch_prefill():
    cfg = SchedulerConfig(max_batch=8, kv_tokens=100_000, step_tokens=2_048)
    sched = Scheduler(cfg, "fsched")
    sched.add(Request("batch", "a", BA, 1_500, 10, 0.0))
    sched.add(Request("rt", "a", RT, 200, 10, 0.0))
    plan = sched.schedule(0.0)
    assert [(c.request_id, c.produces_token) for c in plan.prefill] == [("rt", True)]
