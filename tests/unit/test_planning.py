"""Prefill chunks of one step: by rank within the budget, and a step that yields a due first
token carrying nothing after it."""

from __future__ import annotations

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome, Plan
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


def test_a_starved_prefill_goes_first_but_not_ahead_of_a_due_one_that_outranks_it():
    rt, batch, other = running("rt", RT, 3_000), running("batch", BA, 1_500), running("other", BA, 1_500)
    order = {"rt": 0, "other": 1, "batch": 2}
    rank = lambda r: (order[r.id],)  # noqa: E731
    due = lambda r: r.id == "rt"  # noqa: E731
    batch.idle_steps = 16  # starved a whole minimum quantum

    def first(**kw) -> str:
        return split_rows([rt, other, batch], rank, budget=2_048, min_quantum=16, **kw)[1][0].request_id

    assert first(due=due) == "rt"  # the realtime first token keeps its step
    assert first() == "batch"  # nothing due: the starved prefill goes first, as before
    assert split_rows([other, batch], rank, 2_048, 16, due)[1][0].request_id == "batch"  # none due here
    batch.idle_steps = 32  # starved two quanta: first, whatever is due
    assert first(due=due) == "batch"


def test_a_realtime_prefill_on_target_is_not_held_by_a_starved_batch_prefill():
    """A batch prefill starved behind a longer one of its tenant gets the budget back at its minimum
    quantum; a realtime prompt admitted then still has its chunks in consecutive steps."""
    cfg = SchedulerConfig(max_batch=8, kv_tokens=200_000, step_tokens=1_024, min_quantum_steps=4)
    sched = Scheduler(cfg, "fsched")
    sched.add(Request("long", "a", BA, 40_000, 10, 0.0))
    sched.add(Request("short", "a", BA, 2_000, 10, 0.0))
    now, plans = 0.0, []
    for _ in range(cfg.min_quantum_steps):  # `long` takes every step: `short` starves
        plan = sched.schedule(now)
        assert [c.request_id for c in plan.prefill] == ["long"]
        now += 0.05
        sched.postprocess(plan, _outcome(plan), now)
    sched.add(Request("rt", "b", RT, 2_500, 10, now))
    for _ in range(3):
        plan = sched.schedule(now)
        plans.append([c.request_id for c in plan.prefill])
        now += 0.05
        sched.postprocess(plan, _outcome(plan), now)
    assert plans == [["rt"], ["rt"], ["rt"]]  # before: ["short"] in the first


def _outcome(plan: Plan) -> Outcome:
    return Outcome(0.05)
