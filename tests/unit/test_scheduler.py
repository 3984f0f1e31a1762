"""Mechanism properties of the Scheduler, counted in engine steps.

A tiny fake engine drives `schedule()` / `postprocess()` one step at a time
(one second a step), so every property is checked on every plan.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome
from fsched.core.sched.request import Checkpoint, Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.sched.usage import TenantCharge
from fsched.core.sched.waitqueue import WaitQueue
from fsched.core.types import RequestClass, RequestStatus

CLASSES = list(RequestClass)


class FakeEngine:
    """Runs plans one step a second; a request stops after its `output` tokens."""

    def __init__(self, sched: Scheduler, outputs: dict[str, int]) -> None:
        self.sched = sched
        self.outputs = outputs
        self.now = 0.0
        self.first_token: dict[str, float] = {}
        self.admitted_at: dict[str, int] = {}
        self.violations: list[str] = []
        self.preempted: Counter[str] = Counter()

    def step(self):
        s = self.sched
        plan = s.schedule(self.now)
        self.check(plan)
        finished = set()
        for c in plan.prefill:
            if c.produces_token:
                r = s.running[c.request_id]
                if r.generated == 0:
                    self.first_token[r.id] = self.now + 1
                if r.generated + 1 >= self.outputs[r.id]:
                    finished.add(r.id)
        for rid in plan.decode:
            if s.running[rid].generated + 1 >= self.outputs[rid]:
                finished.add(rid)
        self.now += 1.0
        s.postprocess(plan, Outcome(1.0, frozenset(finished)), self.now)
        return plan

    def check(self, plan) -> None:
        s, cfg = self.sched, self.sched.config
        if len(s.running) > cfg.max_batch:
            self.violations.append(f"slots {len(s.running)} > {cfg.max_batch}")
        if s.kv_committed > cfg.kv_tokens:
            self.violations.append(f"kv {s.kv_committed} > {cfg.kv_tokens}")
        if sum(r.context for r in s.running.values()) != s.kv_committed:
            self.violations.append("kv_committed out of sync")
        if plan.tokens > cfg.step_tokens:
            self.violations.append(f"tokens {plan.tokens} > {cfg.step_tokens}")
        if s.host_used > cfg.host_kv_tokens:
            self.violations.append("host pool overflow")
        for p in plan.preempted:
            ran = s.step - self.admitted_at[p.request_id]
            # run_steps counts steps with progress, which is <= steps since admission.
            # A request never preempted may be (its checkpoint is all it costs); a
            # re-admitted one runs its minimum quantum first: no thrashing.
            if self.preempted[p.request_id] and ran < cfg.min_quantum_steps:
                self.violations.append(f"{p.request_id} preempted again after {ran} steps")
            self.preempted[p.request_id] += 1
        for rid in plan.admitted:
            self.admitted_at[rid] = s.step

    def run(self, max_steps: int) -> None:
        for _ in range(max_steps):
            if not (self.sched.running or self.sched.waiting_count):
                return
            self.step()
        raise AssertionError("did not drain")


def req(rid, tenant="t", request_class=RequestClass.BATCH, prompt=100, output=10, arrival=0.0, prio=5):
    return Request(rid, tenant, request_class, prompt, output, arrival, priority=prio)


request_specs = st.lists(
    st.tuples(
        st.integers(0, 40),  # arrival step
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(CLASSES),
        st.integers(1, 900),  # prompt
        st.integers(1, 60),  # output
        st.integers(0, 9),  # priority
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    policy=st.sampled_from(["fcfs", "priority", "vtc", "fsched"]),
    max_batch=st.integers(1, 8),
    kv_tokens=st.integers(1200, 6000),
    step_tokens=st.integers(16, 600),
    host=st.integers(0, 3000),
    mq=st.integers(1, 6),
)
def test_budgets_min_quantum_and_drain(specs, policy, max_batch, kv_tokens, step_tokens, host, mq):
    """Never more than the slot, KV and token budgets; no request preempted
    twice within the minimum quantum; every request completes."""
    step_tokens = max(step_tokens, max_batch + 1)
    mq = min(mq, (kv_tokens - 1) // max_batch)
    cfg = SchedulerConfig(
        max_batch=max_batch, kv_tokens=kv_tokens, step_tokens=step_tokens,
        host_kv_tokens=host, min_quantum_steps=mq,
    )
    sched = Scheduler(cfg, policy, {"a": 3, "b": 1})
    specs = sorted(specs)
    outputs = {}
    eng = FakeEngine(sched, outputs)
    pending = [
        req(str(i), t, c, min(p, kv_tokens - o - mq), o, float(at), pr)
        for i, (at, t, c, p, o, pr) in enumerate(specs)
    ]
    for r in pending:
        outputs[r.id] = r.max_tokens
    steps = 0
    while pending or sched.running or sched.waiting_count:
        while pending and pending[0].arrival <= eng.now:
            sched.add(pending.pop(0))
        eng.step()
        steps += 1
        assert steps < 20_000, "did not drain"
    assert eng.violations == []
    assert set(eng.first_token) == set(outputs)


class _StandingsRemade(WaitQueue):
    """A wait queue that never lets the scheduler keep its standings across an admission."""

    __slots__ = ()

    def one_standing(self) -> bool:
        return False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=request_specs, policy=st.sampled_from(["fcfs", "priority", "vtc", "fsched"]),
       one_tenant=st.booleans(), max_batch=st.integers(1, 32), host=st.integers(0, 3000))
def test_standings_kept_while_one_tenant_waits_make_the_plans_remaking_them_at_each_admission_makes(
        specs, policy, one_tenant, max_batch, host):
    """A burst of one tenant's work is admitted without the standings made again at each admission:
    the plans are, step by step, those of a scheduler that makes them every time."""
    cfg = SchedulerConfig(max_batch=max_batch, kv_tokens=4_000, step_tokens=300, host_kv_tokens=host)
    kept, remade = Scheduler(cfg, policy, {"a": 3, "b": 1}), Scheduler(cfg, policy, {"a": 3, "b": 1})
    remade._waiting.__class__ = _StandingsRemade
    engines = []
    for sched in (kept, remade):
        outputs = {}
        pending = [req(str(i), "a" if one_tenant else t, c, min(p, 3_000), o, float(at // 8), pr)
                   for i, (at, t, c, p, o, pr) in enumerate(sorted(specs))]  # bursts: 8 steps' at once
        outputs.update((r.id, r.max_tokens) for r in pending)
        engines.append((FakeEngine(sched, outputs), pending))
    for _ in range(2_000):
        plans = []
        for eng, pending in engines:
            while pending and pending[0].arrival <= eng.now:
                eng.sched.add(pending.pop(0))
            plans.append(eng.step())
        assert plans[0] == plans[1]
        if not any(pending or eng.sched.running or eng.sched.waiting_count for eng, pending in engines):
            return
    raise AssertionError("did not drain")


def test_a_burst_of_two_tenants_is_admitted_by_their_standings_after_each_admission():
    """With two tenants' work waiting, each admission moves its tenant's score and the next pick reads
    it: equal weights, room for four of eight, two each."""
    sched = Scheduler(SchedulerConfig(max_batch=4, kv_tokens=40_000, step_tokens=4_000), "fsched")
    for i in range(4):
        for tenant in ("a", "b"):
            sched.add(req(f"{tenant}{i}", tenant, RequestClass.BATCH, prompt=500, output=50))
    plan = sched.schedule(0.0)
    assert sorted(rid[0] for rid in plan.admitted) == ["a", "a", "b", "b"]


def _full_batch_of_batch(cfg: SchedulerConfig, n_steps: int):
    sched = Scheduler(cfg, "fsched")
    outputs = {}
    eng = FakeEngine(sched, outputs)
    for i in range(cfg.max_batch):
        r = req(f"b{i}", "t", RequestClass.BATCH, prompt=200, output=10_000)
        outputs[r.id] = r.max_tokens
        sched.add(r)
    for _ in range(n_steps):
        eng.step()
    assert len(sched.running) == cfg.max_batch
    assert all(r.pending_prefill == 0 for r in sched.running.values())
    return sched, eng, outputs


@settings(max_examples=25, deadline=None)
@given(prompt=st.integers(1, 5000), warm=st.integers(0, 30), tenant=st.sampled_from(["t", "u"]))
def test_realtime_first_token_within_its_prefill_plus_two_steps(prompt, warm, tenant):
    cfg = SchedulerConfig(
        max_batch=8, kv_tokens=200_000, step_tokens=512, min_quantum_steps=4
    )
    sched, eng, outputs = _full_batch_of_batch(cfg, cfg.min_quantum_steps + 4 + warm)
    rt = req("rt", tenant, RequestClass.REALTIME, prompt=prompt, output=5, arrival=eng.now)
    outputs["rt"] = 5
    sched.add(rt)
    arrived = eng.now
    for _ in range(100):
        eng.step()
        if "rt" in eng.first_token:
            break
    prefill_steps = math.ceil(prompt / (cfg.step_tokens - (cfg.max_batch - 1)))
    assert eng.first_token["rt"] - arrived <= prefill_steps + 2
    assert eng.violations == []


@pytest.mark.parametrize("preempted_before", [0, 1])
def test_a_readmitted_request_runs_its_minimum_quantum_before_it_is_preempted_again(preempted_before):
    """Negative control of the latency property: a victim that was preempted
    before is protected for its minimum quantum; a fresh one costs only its
    checkpoint and is not."""
    cfg = SchedulerConfig(max_batch=2, kv_tokens=100_000, step_tokens=512, min_quantum_steps=6)
    sched = Scheduler(cfg, "fsched")
    outputs = {"b0": 100, "b1": 100, "rt": 3}
    eng = FakeEngine(sched, outputs)
    for rid in ("b0", "b1"):
        b = req(rid, output=100)
        b.preemptions = preempted_before
        sched.add(b)
    eng.step()
    sched.add(req("rt", request_class=RequestClass.REALTIME, prompt=10, output=3, arrival=eng.now))
    plans = [eng.step() for _ in range(8)]
    admitted_at = next(i for i, p in enumerate(plans) if "rt" in p.admitted)
    # b0/b1 ran 1 step before rt arrived
    assert admitted_at == (cfg.min_quantum_steps - 1 if preempted_before else 0)


def _realtime_beside_a_request_about_to_leave(cfg):
    """Two batch requests fill both slots, one of them 2 steps from its max_tokens; then a
    realtime request arrives. The next 4 plans."""
    sched = Scheduler(cfg, "fsched")
    outputs = {"long": 100, "short": 4, "rt": 3}
    eng = FakeEngine(sched, outputs)
    sched.add(req("long", output=100))
    sched.add(req("short", output=4))
    eng.step()  # both prefilled; short has 3 tokens left
    eng.step()  # 2 left
    sched.add(req("rt", request_class=RequestClass.REALTIME, prompt=10, output=3, arrival=eng.now))
    return [eng.step() for _ in range(4)]


def test_no_preemption_when_a_slot_frees_within_the_grace_steps():
    """A running request reaching max_tokens within 2 steps frees its slot in
    time: a realtime request whose target is out of reach anyway (0.5 s at a
    second a step) waits for it instead of costing a victim its checkpoint."""
    plans = _realtime_beside_a_request_about_to_leave(
        SchedulerConfig(max_batch=2, kv_tokens=100_000, step_tokens=512, min_quantum_steps=1))
    assert not any(p.preempted for p in plans)
    assert "rt" in plans[2].admitted  # short finished after 2 steps


def test_a_request_that_can_still_make_its_target_does_not_spend_it_waiting_for_a_slot():
    """The same, with a target the realtime request can still make (10 s): waiting 2 steps
    would spend its slack, so it preempts at once."""
    plans = _realtime_beside_a_request_about_to_leave(
        SchedulerConfig(max_batch=2, kv_tokens=100_000, step_tokens=512, min_quantum_steps=1,
                        realtime_target_s=10.0))
    assert "rt" in plans[0].admitted and plans[0].preempted


def realtime_after_two_running(cfg, first, second, rt_prompt, output):
    """Two batch requests (id, prompt), the second arriving later, run two steps;
    then a realtime request "rt" of another tenant arrives. The scheduler and that step's plan."""
    sched = Scheduler(cfg, "fsched")
    eng = FakeEngine(sched, {first[0]: output, second[0]: output, "rt": 2})
    sched.add(req(first[0], prompt=first[1], output=output))
    sched.add(req(second[0], prompt=second[1], output=output, arrival=0.5))
    eng.step()
    eng.step()
    sched.add(req("rt", "u", RequestClass.REALTIME, prompt=rt_prompt, output=2, arrival=eng.now))
    return sched, eng.step()


def test_no_victim_is_preempted_for_room_a_later_victim_makes_anyway():
    """The policy prefers the small victim, but only the big one's KV makes room
    for the long realtime prompt: the big one alone is preempted."""
    cfg = SchedulerConfig(max_batch=4, kv_tokens=10_000, step_tokens=8192, min_quantum_steps=1,
                          preempt_grace_steps=0)
    # "small" is the younger: first in victim order
    sched, plan = realtime_after_two_running(cfg, ("big", 6000), ("small", 1000), rt_prompt=7000, output=500)
    assert [p.request_id for p in plan.preempted] == ["big"] and "rt" in plan.admitted
    assert "small" in sched.running


def test_preemptions_per_request_are_bounded():
    """After max_preemptions a request runs to completion however much
    realtime work arrives."""
    # Precedence measured from the first step (no warm-up): u's flood of one request a step
    # loses it within a few steps, so b gets to run between the flood's turns.
    cfg = SchedulerConfig(max_batch=1, kv_tokens=100_000, step_tokens=512, min_quantum_steps=1,
                          max_preemptions=2, preempt_grace_steps=0, precedence_warmup_s=0.0)
    sched = Scheduler(cfg, "fsched")
    outputs = {"b": 40}
    eng = FakeEngine(sched, outputs)
    sched.add(req("b", output=40))
    for i in range(30):
        rid = f"rt{i}"
        outputs[rid] = 2
        sched.add(req(rid, "u", RequestClass.REALTIME, prompt=5, output=2, arrival=eng.now))
        eng.step()
    assert eng.preempted["b"] == 2


def test_a_long_context_is_not_recomputed_when_it_cannot_be_parked():
    """No host room: a victim holding more than max_recompute_tokens is not a
    victim; a short one is dropped and recomputed."""
    cfg = SchedulerConfig(max_batch=2, kv_tokens=100_000, step_tokens=4096, min_quantum_steps=1,
                          host_kv_tokens=0, max_recompute_tokens=1000, preempt_grace_steps=0)
    # "big" is the younger: first in victim order
    _, plan = realtime_after_two_running(cfg, ("small", 500), ("big", 3000), rt_prompt=10, output=50)
    assert [(p.request_id, p.checkpoint) for p in plan.preempted] == [("small", Checkpoint.RECOMPUTE)]


def test_preemption_parks_when_host_has_room_else_recomputes():
    cfg = SchedulerConfig(
        max_batch=2, kv_tokens=100_000, step_tokens=512, min_quantum_steps=2,
        host_kv_tokens=150,
    )
    sched = Scheduler(cfg, "fsched")
    outputs = {"b0": 50, "b1": 50, "r0": 2, "r1": 2}
    eng = FakeEngine(sched, outputs)
    sched.add(req("b0", prompt=100, output=50))
    sched.add(req("b1", prompt=100, output=50, arrival=0.001))
    for _ in range(4):
        eng.step()
    sched.add(req("r0", request_class=RequestClass.REALTIME, prompt=10, output=2, arrival=eng.now))
    sched.add(req("r1", request_class=RequestClass.REALTIME, prompt=10, output=2, arrival=eng.now))
    plan = eng.step()
    kinds = sorted(p.checkpoint for p in plan.preempted)
    assert kinds == [Checkpoint.PARK, Checkpoint.RECOMPUTE]
    parked = next(p for p in plan.preempted if p.checkpoint is Checkpoint.PARK)
    dropped = next(p for p in plan.preempted if p.checkpoint is Checkpoint.RECOMPUTE)
    assert sched.host_used == parked.kv_tokens == 103  # 100 prompt + 4 generated - 1 pending
    assert sched.get(dropped.request_id).computed == 0
    eng.run(500)
    assert eng.violations == []
    assert sched.host_used == 0


def test_recomputed_request_prefills_its_whole_context_and_resumes_generation():
    cfg = SchedulerConfig(
        max_batch=1, kv_tokens=10_000, step_tokens=64, min_quantum_steps=2, host_kv_tokens=0
    )
    sched = Scheduler(cfg, "fsched")
    outputs = {"b": 20, "r": 1}
    eng = FakeEngine(sched, outputs)
    sched.add(req("b", prompt=100, output=20))
    for _ in range(6):
        eng.step()  # 2 prefill steps (64 + 36 tokens), then 4 decodes
    b = sched.get("b")
    assert b.generated == 5
    sched.add(req("r", request_class=RequestClass.REALTIME, prompt=10, output=1, arrival=eng.now))
    plan = eng.step()
    assert plan.preempted[0].checkpoint is Checkpoint.RECOMPUTE
    eng.step()  # b readmitted
    assert b.generated == 5 and b.computed == 64  # re-prefilling 105 tokens of context
    plan = eng.step()
    assert plan.prefill[0].request_id == "b" and plan.prefill[0].start == 64
    assert plan.prefill[0].tokens == 41 and plan.prefill[0].produces_token
    assert b.generated == 6 and b.computed == 105
    eng.run(100)
    assert b.status is RequestStatus.FINISHED_LENGTH and b.generated == 20


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 25),
    run_steps=st.integers(0, 30),
    cancel_mask=st.lists(st.booleans(), min_size=25, max_size=25),
    host=st.sampled_from([0, 5_000]),
    policy=st.sampled_from(["fcfs", "priority", "vtc", "fsched"]),
)
def test_cancel_removes_from_every_queue(n, run_steps, cancel_mask, host, policy):
    cfg = SchedulerConfig(
        max_batch=4, kv_tokens=4_000, step_tokens=256, min_quantum_steps=2,
        host_kv_tokens=host,
    )
    sched = Scheduler(cfg, policy)
    outputs = {}
    eng = FakeEngine(sched, outputs)
    for i in range(n):
        request_class = CLASSES[i % 3]
        r = req(str(i), "ab"[i % 2], request_class, prompt=50 + 37 * i, output=5 + i, arrival=i * 0.5)
        outputs[r.id] = r.max_tokens
        sched.add(r)
    for _ in range(run_steps):
        if sched.running or sched.waiting_count:
            eng.step()
    live = [rid for rid in outputs if sched.get(rid) is not None]
    cancelled = {rid for rid in live if cancel_mask[int(rid)]}
    for rid in cancelled:
        assert sched.cancel(rid)
        assert not sched.cancel(rid)
    waiting_ids = {r.id for r in sched.waiting()}
    assert not cancelled & (waiting_ids | set(sched.running))
    assert all(sched.get(rid) is None for rid in cancelled)
    assert sched.waiting_count == len(waiting_ids)
    assert sched.kv_committed == sum(r.context for r in sched.running.values())
    assert sched.host_used == sum(r.computed for r in sched.waiting() if r.parked)
    while sched.running or sched.waiting_count:
        plan = eng.step()
        mentioned = set(plan.decode) | {c.request_id for c in plan.prefill} | set(plan.admitted)
        assert not mentioned & cancelled
    assert eng.violations == []


def test_cancel_during_a_step_is_ignored_by_postprocess():
    sched = Scheduler(SchedulerConfig(), "fsched")
    sched.add(req("x", prompt=10, output=5))
    plan = sched.schedule(0.0)
    assert sched.cancel("x")
    sched.postprocess(plan, Outcome(0.1), 0.1)
    assert sched.kv_committed == 0 and not sched.running


@pytest.mark.parametrize("a_weight", [1.0, 4.0])
def test_weight_change_takes_effect_at_next_schedule(a_weight):
    """A weight change keeps today's scores (no jump from old usage) and changes how
    fast usage counts from now on: the next admissions follow the new weights."""
    cfg = SchedulerConfig(max_batch=1, kv_tokens=10_000, step_tokens=128)
    sched = Scheduler(cfg, "fsched", {"a": 1, "b": 1})
    sched.meter.charge({"a": TenantCharge(gpu_s=1.0), "b": TenantCharge(gpu_s=1.0)}, 2.0, 0.0)
    before = sched.meter.scores(["a", "b"], 0.0)
    sched.set_weight("a", a_weight)
    assert sched.meter.scores(["a", "b"], 0.0) == pytest.approx(before)
    # Equal service from now on: a's score rises 1/a_weight as fast as b's.
    sched.meter.charge({"a": TenantCharge(gpu_s=1.0), "b": TenantCharge(gpu_s=1.0)}, 2.0, 0.0)
    after = sched.meter.scores(["a", "b"], 0.0)
    rise_a, rise_b = after["a"] - before["a"], after["b"] - before["b"]
    assert rise_a == pytest.approx(rise_b / a_weight)


def test_add_rejects_duplicates_and_requests_larger_than_the_kv_budget():
    sched = Scheduler(SchedulerConfig(kv_tokens=5_000), "fsched")
    sched.add(req("x"))
    with pytest.raises(ValueError, match="already"):
        sched.add(req("x"))
    with pytest.raises(ValueError, match="KV"):
        sched.add(req("y", prompt=4_000, output=1_000))


def test_a_resumed_prefill_never_stops_one_token_short():
    """A request resumed with tokens already generated prefills prompt + tokens; a chunk
    ending at context - 1 would look like a decoding request (found by the crash test:
    the plan decoded a request the engine was still prefilling)."""
    cfg = SchedulerConfig(max_batch=2, kv_tokens=10_000, step_tokens=14)
    sched = Scheduler(cfg, "fcfs")
    r = req("r", prompt=10, output=20)
    r.generated = 5  # context 15: one step's budget (14) would leave exactly one token
    sched.add(r)
    now, seen = 0.0, []
    for _ in range(4):
        plan = sched.schedule(now)
        seen.append((tuple((c.start, c.tokens, c.produces_token) for c in plan.prefill), plan.decode))
        now += 1.0
        sched.postprocess(plan, Outcome(1.0), now)
    assert seen[0] == (((0, 13, False),), ())
    assert seen[1] == (((13, 2, True),), ())
    assert seen[2] == ((), ("r",))


def test_an_aged_batch_request_is_never_passed_by_newer_work_of_its_line():
    """Batch by deadline under overload (one request a step, about half served): work that can
    still make its target passes work that cannot, but once a request has waited `aging_factor` x
    its target it goes first, oldest first: no request is passed by newer work past its aging
    limit (the starvation bound)."""
    cfg = SchedulerConfig(max_batch=2, kv_tokens=100_000, step_tokens=512, batch_target_s=10.0)
    sched = Scheduler(cfg, "fsched")
    outputs: dict[str, int] = {}
    eng = FakeEngine(sched, outputs)
    admitted: dict[str, tuple[float, float]] = {}  # id -> (arrival, admitted at)
    passed_late = 0
    for i in range(200):
        rid = f"r{i}"
        outputs[rid] = 3
        if i < 120:
            sched.add(req(rid, prompt=20, output=3, arrival=eng.now))
        waiting = list(sched.waiting())
        now = eng.now
        plan = eng.step()
        for a in plan.admitted:
            r = next(w for w in waiting if w.id == a)
            admitted[a] = (r.arrival, now)
            older = [w for w in waiting if w.arrival < r.arrival and w.id not in plan.admitted]
            assert not [w for w in older if w.aged_at <= now], (a, now)  # no aged request passed
            passed_late += bool(older)
    assert len(admitted) == 120
    assert passed_late > 10  # the order did pass late work (else the check above says nothing)
    waits = [at - arrival for arrival, at in admitted.values()]
    assert max(waits) > cfg.aging_factor * cfg.batch_target_s  # overloaded past the aging limit


@pytest.mark.parametrize("cut", [True, False])
def test_realtime_requests_arriving_together_under_a_full_batch_start_in_one_step_unless_the_step_is_cut(cut):
    """With the cut (an engine whose step fsched composes), the step that yields one realtime first
    token carries no more prefill; without it (a remote engine, which composes its own iterations),
    every realtime request that arrived together starts its prefill, and so its stream, at once."""
    cfg = SchedulerConfig(max_batch=8, kv_tokens=200_000, step_tokens=512, min_quantum_steps=4,
                          cut_prefill_for_first_token=cut)
    sched, eng, outputs = _full_batch_of_batch(cfg, cfg.min_quantum_steps + 4)
    arrived = [req(f"rt{i}", "u", RequestClass.REALTIME, prompt=20, output=5, arrival=eng.now)
               for i in range(4)]
    for r in arrived:
        outputs[r.id] = 5
        sched.add(r)
    plan = eng.step()
    started = {c.request_id for c in plan.prefill if c.produces_token}
    assert len(plan.preempted) == 4
    assert len(started) == (1 if cut else 4) and started <= {r.id for r in arrived}
    assert eng.violations == []
