"""Backfill: requests behind a blocked head take the room it leaves, never its turn.

Pure: a scheduler stepped one step at a time by a fake engine that runs
every request to its max_tokens (the case the reservation is computed for).
"""

from __future__ import annotations

import random

import pytest

from fsched.core.sched.backfill import Reservation, behind_in_share, reserve_for
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome
from fsched.core.sched.policy import Standing
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass

BA = RequestClass.BATCH
CFG = SchedulerConfig(max_batch=8, kv_tokens=2_000, step_tokens=256, min_quantum_steps=4,
                      host_kv_tokens=0)


def req(rid: str, prompt: int, out: int, tenant: str = "a", arrival: float = 0.0) -> Request:
    return Request(rid, tenant, BA, prompt, out, arrival)


def run(sched: Scheduler, steps: int) -> dict[str, int]:
    """Step the scheduler; the step at which each request was admitted (first time)."""
    admitted: dict[str, int] = {}
    for step in range(steps):
        plan = sched.schedule(float(step))
        for rid in plan.admitted:
            admitted.setdefault(rid, step)
        sched.postprocess(plan, Outcome(1.0), float(step + 1))
    return admitted


def blocked_head_workload() -> list[Request]:
    # A long request holds most of the KV for ~40 steps; the head (next in
    # line) needs more than is left; short work queues behind the head.
    shorts = [req(f"short{i}", 60, 4, arrival=2.0 + i) for i in range(4)]
    return [req("hold", 1_200, 40), req("head", 900, 5, arrival=1.0), *shorts,
            req("long-tail", 500, 700, arrival=9.0)]


def test_short_work_runs_behind_a_blocked_head_which_starts_by_its_reservation():
    with_bf = Scheduler(CFG, "fsched", {"a": 1})
    without = Scheduler(SchedulerConfig(**{**_fields(CFG), "backfill": False}), "fsched", {"a": 1})
    for s in (with_bf, without):
        for r in blocked_head_workload():
            s.add(r)
    a_bf, a_plain = run(with_bf, 120), run(without, 120)
    # "hold" decodes from step 5 (5 chunks of 256, the last yielding a token): leaves at 5 + 39
    assert a_bf["head"] == a_plain["head"] == 44
    assert all(a_bf[f"short{i}"] < 10 for i in range(4))  # they ran in the room it left
    assert with_bf.backfilled == 4 and without.backfilled == 0
    assert all(a_plain[f"short{i}"] >= a_plain["head"] for i in range(4))  # without: idle room
    # 700 decode steps outlast the head's reservation, 1,200 tokens would not fit beside it
    assert a_bf["long-tail"] >= a_bf["head"]


@pytest.mark.parametrize("policy", ["fcfs", "priority", "vtc"])
def test_the_baselines_stop_at_a_blocked_head_as_engines_do(policy):
    sched = Scheduler(CFG, policy, {"a": 1})
    for r in blocked_head_workload():
        sched.add(r)
    admitted = run(sched, 120)
    assert all(admitted[f"short{i}"] >= admitted["head"] for i in range(4))


def _fields(cfg: SchedulerConfig) -> dict:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


def decoding(r: Request, generated: int = 1) -> Request:
    r.generated = generated
    r.computed = r.context - 1
    return r


def test_reservation_is_when_enough_decoding_work_has_left():
    running = [decoding(req("r1", 500, 10)), decoding(req("r2", 500, 30)), decoding(req("r3", 200, 50))]
    head = req("head", 1_000, 10)
    # final contexts 510, 530, 250; a reserve of 4 per running request and the head
    res = reserve_for(head, running, CFG, slots=8)
    assert res.step == 9  # r1's remaining tokens
    assert res.spare_kv == 2_000 - 530 - 250 - 3 * 4 - 1_000
    assert res.spare_slots == 8 - 2 - 1


def test_a_prefilling_request_leaves_after_the_running_prefills_and_its_decode():
    prefilling = req("p", 1_500, 5)
    # 248 prefill tokens a step at worst (256 less 8 decodes): 7 steps, 1 more
    # if a chunk stops a token short, the last chunk yields a token, 4 decodes
    res = reserve_for(req("head", 500, 10), [prefilling], CFG, slots=8)
    assert (res.step, res.prefill_tokens, res.prefills, res.leaving_prefill) == (12, 1_500, 1, 5)
    beside = reserve_for(req("head", 300, 10), [prefilling], CFG, slots=8)
    assert (beside.step, beside.leaving_prefill) == (0, None)  # fits beside it at its end


def test_admits_what_leaves_by_the_reservation_or_fits_beside_the_head():
    res = Reservation(step=20, spare_kv=100, spare_slots=1, prefill_tokens=0, prefills=0,
                      leaving_prefill=None)
    assert res.admits(req("quick", 100, 10), CFG)  # 1 chunk + 9 decodes <= 20
    assert not res.admits(req("slow", 100, 60), CFG)  # outlasts it, 160 + 4 > 100 spare
    assert res.admits(req("small", 30, 60), CFG)  # outlasts it, but 94 fits beside the head
    assert (res.spare_kv, res.spare_slots) == (6, 0)
    assert not res.admits(req("small2", 1, 60), CFG)  # no spare slot left


def test_prefill_ahead_delays_a_candidate_past_the_reservation():
    res = Reservation(step=10, spare_kv=0, spare_slots=0, prefill_tokens=248 * 9, prefills=1,
                      leaving_prefill=None)
    # 248 prefill tokens a step at worst: 10 steps with its own, 2 short, 1 decode
    assert not res.admits(req("late", 100, 2), CFG)
    assert Reservation(step=10, spare_kv=0, spare_slots=0, prefill_tokens=0, prefills=0,
                       leaving_prefill=None).admits(req("early", 100, 2), CFG)


def test_a_candidate_never_holds_back_a_prefill_the_reservation_counts_on():
    # a running prefill of 248 x 7 tokens and 3 tokens to decode leaves within 7 + 1 + 2 = 10
    res = Reservation(step=10, spare_kv=10_000, spare_slots=4, prefill_tokens=248 * 7, prefills=1,
                      leaving_prefill=3)
    assert not res.admits(req("small", 10, 1), CFG)  # even one that fits beside the head
    assert res.admits(decoding(req("resumed", 10, 5)), CFG)  # nothing left to prefill


def test_only_the_heads_tenant_or_one_further_below_its_share_backfills():
    head, mine, other = req("h", 10, 1, "a"), req("m", 10, 1, "a"), req("o", 10, 1, "b")
    assert behind_in_share(mine, head, {"a": Standing(2.0), "b": Standing(1.0)})
    assert behind_in_share(other, head, {"a": Standing(2.0), "b": Standing(1.0)})
    assert not behind_in_share(other, head, {"a": Standing(1.0), "b": Standing(2.0)})


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_blocked_head_starts_by_its_reservation_whatever_is_backfilled(seed):
    """Random single-tenant batch work: every time the head does not fit, its
    reservation is noted; it is admitted by then at the latest (unless an
    eviction put a request ahead of it meanwhile)."""
    rng = random.Random(seed)
    sched = Scheduler(CFG, "fsched", {"a": 1})
    for i in range(60):
        sched.add(req(f"r{i}", rng.choice([20, 80, 300, 900, 1_400]), rng.choice([2, 10, 40, 120]),
                      arrival=float(i)))
    deadline: dict[str, int] = {}
    admitted: dict[str, int] = {}
    for step in range(3_000):
        # the head in the policy's order (batch by deadline: a request that went late goes behind,
        # and is then no longer the head its reservation was promised to)
        stand = sched.standings(float(step))
        waiting = sorted(sched.waiting(), key=lambda r: sched.policy.rank(r, float(step), stand))
        deadline = {rid: d for rid, d in deadline.items()
                    if rid in admitted or (waiting and rid == waiting[0].id)}
        if waiting:
            head = waiting[0]
            free = CFG.kv_tokens - sched.kv_committed - (len(sched.running) + 1) * CFG.min_quantum_steps
            if free < head.context and len(sched.running) < CFG.max_batch:
                res = reserve_for(head, sched.running.values(), CFG, CFG.max_batch)
                if res is not None:
                    deadline.setdefault(head.id, step + res.step)
        plan = sched.schedule(float(step))
        if plan.preempted:  # decode growth evicted a request: it is ahead of the head again
            deadline = {rid: d for rid, d in deadline.items() if rid in admitted}
        for rid in plan.admitted:
            admitted.setdefault(rid, step)
        sched.postprocess(plan, Outcome(1.0), float(step + 1))
        if not sched.waiting_count and not sched.running:
            break
    assert len(admitted) == 60
    assert len(deadline) >= 5, "the workload seldom blocked a head"
    late = {rid: (admitted[rid], d) for rid, d in deadline.items() if admitted[rid] > d}
    assert not late


def test_no_backfill_behind_a_head_that_may_preempt():
    """A realtime head takes room by preemption; batch started in its way
    would only be more to displace, so nothing starts behind it."""
    rt = RequestClass.REALTIME
    sched = Scheduler(CFG, "fsched", {"a": 1})
    # its own class: not a victim; its tenant's more urgent base priority starts it first (inside a
    # class, the shorter prefill would go first)
    hold = Request("hold", "a", rt, 1_200, 40, 0.0, priority=4)
    head = Request("head", "a", rt, 900, 5, 1.0)
    for r in (hold, head, req("short", 60, 4, arrival=2.0)):
        sched.add(r)
    admitted = run(sched, 60)
    assert admitted["short"] >= admitted["head"] > 0
    assert sched.backfilled == 0
