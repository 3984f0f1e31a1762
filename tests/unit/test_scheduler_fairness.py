"""The fairness contract's properties: DRF, idle return and no starvation.

Everything runs with one second per engine step, so time is steps and
the assertions are ratios or step counts.
"""

from __future__ import annotations

import functools
import random
from collections import defaultdict

import pytest

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.sched.shares import served_shares
from fsched.core.sim.bounds import first_token_bound_s
from fsched.core.sim.costmodel import CostModel
from fsched.core.sim.simulator import simulate
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass

UNIT = CostModel(base_s=1.0, token_s=0.0, kv_token_s=0.0, swap_token_s=0.0)
BATCH = RequestClass.BATCH


def run_steps(sched: Scheduler, arrivals: list[Request], steps: int):
    """Drive `sched` one 1-second step at a time; per step, what each tenant
    consumed and which tenants had work waiting."""
    arrivals = sorted(arrivals, key=lambda r: r.arrival)
    outputs = {r.id: r.max_tokens for r in arrivals}
    log = []
    now = 0.0
    for _ in range(steps):
        while arrivals and arrivals[0].arrival <= now:
            sched.add(arrivals.pop(0))
        backlogged = set(sched.backlogged_tenants())
        plan = sched.schedule(now)
        finished = set()
        for c in plan.prefill:
            if c.produces_token and sched.running[c.request_id].generated + 1 >= outputs[c.request_id]:
                finished.add(c.request_id)
        for rid in plan.decode:
            if sched.running[rid].generated + 1 >= outputs[rid]:
                finished.add(rid)
        now += 1.0
        charges = sched.postprocess(plan, Outcome(1.0, frozenset(finished)), now).charges
        log.append(({t: (c.gpu_s, c.kv_token_s) for t, c in charges.items()}, backlogged))
    return log


def window_shares(log, start: int, end: int, kv_capacity: int) -> dict[str, float]:
    gpu, kv = defaultdict(float), defaultdict(float)
    for charges, _ in log[start:end]:
        for t, (g, k) in charges.items():
            gpu[t] += g
            kv[t] += k
    return served_shares({t: (gpu[t], kv[t]) for t in gpu}, kv_capacity)


def backlog(tenant: str, n: int, prompt, output, start: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = prompt if isinstance(prompt, int) else rng.randint(*prompt)
        o = output if isinstance(output, int) else rng.randint(*output)
        out.append(Request(f"{tenant}{i}", tenant, BATCH, p, o, start + i * 1e-3))
    return out


CFG = SchedulerConfig(max_batch=16, kv_tokens=200_000, step_tokens=1024, min_quantum_steps=4)


@pytest.mark.parametrize(
    "prompt, output",
    [(200, 50), (1000, 20), (30, 200), ((10, 2000), (5, 300))],
)
def test_weighted_share_3_to_1_over_every_window(prompt, output):
    sched = Scheduler(CFG, "fsched", {"a": 3, "b": 1})
    arrivals = backlog("a", 2_500, prompt, output, seed=1) + backlog("b", 2_500, prompt, output, seed=2)
    log = run_steps(sched, arrivals, 2_000)
    assert all(b == {"a", "b"} for _, b in log), "both must stay backlogged"
    for start in range(200, 1_601, 400):  # windows of 400 steps after 200 of warm-up
        share = window_shares(log, start, start + 400, CFG.kv_tokens)["a"]
        assert abs(share - 0.75) <= 0.05, (start, share)


def test_fcfs_does_not_meet_the_weighted_share():
    """Negative control: the window check above can fail."""
    sched = Scheduler(CFG, "fcfs", {"a": 3, "b": 1})
    arrivals = backlog("a", 2_500, 200, 50) + backlog("b", 2_500, 200, 50)
    log = run_steps(sched, arrivals, 800)
    share = window_shares(log, 200, 600, CFG.kv_tokens)["a"]
    assert abs(share - 0.75) > 0.15


def _alone() -> list[TraceRequest]:
    """One tenant's backlog, deep enough to keep every slot busy for hundreds of steps."""
    rng = random.Random(7)
    return [TraceRequest(i * 0.01, "a", BATCH, rng.randint(10, 1500), rng.randint(1, 200))
            for i in range(150)]


ALONE = _alone()
ALONE_WEIGHTS = {"a": 3, "b": 1}  # b is configured but never shows up


@functools.cache
def fcfs_alone_makespan() -> float:
    return simulate(ALONE, "fcfs", weights=ALONE_WEIGHTS, config=CFG, cost=UNIT).makespan_s


@pytest.mark.parametrize("policy", ["fsched", "vtc"])
def test_work_conserving_alone(policy):
    """One backlogged tenant gets everything: every slot stays busy and the
    makespan equals fcfs's."""
    busy = []

    def observe(now, plan, sched):
        if sched.waiting_count:
            busy.append(len(sched.running) == CFG.max_batch)

    report = simulate(ALONE, policy, weights=ALONE_WEIGHTS, config=CFG, cost=UNIT, observer=observe)
    assert len(busy) > 100 and all(busy)
    assert report.tenants["a"].share == pytest.approx(1.0)
    assert report.tenants["a"].entitled == 1.0 and report.jain_index == pytest.approx(1.0)
    # Same work, no idling: the order may pack steps a little differently.
    assert report.makespan_s == pytest.approx(fcfs_alone_makespan(), rel=0.01)


def test_drf_equalises_dominant_shares_of_kv_heavy_and_compute_heavy_tenants():
    # The default half-life (120 s) spans thousands of real engine steps;
    # here a step is a second, so the half-life is scaled to match.
    cfg = SchedulerConfig(
        max_batch=16,
        kv_tokens=20_000,
        step_tokens=1024,
        min_quantum_steps=4,
        usage_half_life_s=1_000.0,
    )
    kv_heavy = backlog("kv", 400, 2_500, 40)  # long prompts held while decoding
    compute = backlog("cpu", 400, 20, 120, seed=3)  # short prompts, long outputs
    sched = Scheduler(cfg, "fsched", {"kv": 1, "cpu": 1})
    log = run_steps(sched, kv_heavy + compute, 1_200)
    gpu, kv = defaultdict(float), defaultdict(float)
    for charges, backlogged in log[200:]:
        assert backlogged == {"kv", "cpu"}
        for t, (g, k) in charges.items():
            gpu[t] += g
            kv[t] += k / cfg.kv_tokens
    # The two tenants are dominated by different resources ...
    assert kv["kv"] > gpu["kv"] and gpu["cpu"] > kv["cpu"]
    dom = {t: max(gpu[t], kv[t]) for t in ("kv", "cpu")}
    # ... and DRF equalises their dominant shares.
    assert dom["kv"] / dom["cpu"] == pytest.approx(1.0, abs=0.1)

    # Negative control: VTC counts tokens, not resources, and misses it.
    vtc = Scheduler(cfg, "vtc", {"kv": 1, "cpu": 1})
    vlog = run_steps(vtc, backlog("kv", 400, 2_500, 40) + backlog("cpu", 400, 20, 120, seed=3), 1_200)
    v = window_shares(vlog, 200, 1_200, cfg.kv_tokens)
    assert abs(v["kv"] - v["cpu"]) > 0.2


@pytest.mark.parametrize("lift, bound", [(True, (0.0, 0.6)), (False, (0.8, 1.0))])
def test_returning_idle_tenant_gets_no_burst_beyond_the_lift(lift, bound):
    """b returns after idling while a kept the engine busy: with the lift it
    gets no more than its half; without it (control) it takes nearly all."""
    cfg = SchedulerConfig(
        max_batch=8,
        kv_tokens=100_000,
        step_tokens=512,
        min_quantum_steps=4,
        usage_half_life_s=120.0,
        lift_idle_tenants=lift,
    )
    sched = Scheduler(cfg, "fsched", {"a": 1, "b": 1})
    a = backlog("a", 3_000, 200, 50)
    b_before = backlog("b", 60, 200, 50)  # b keeps up for a while, then goes idle
    b_after = [Request(f"b-late{i}", "b", BATCH, 200, 50, 1_500.0 + i * 1e-3) for i in range(400)]
    log = run_steps(sched, a + b_before + b_after, 1_800)
    assert "b" not in log[1_400][1]  # b was idle before returning
    share_b = window_shares(log, 1_500, 1_600, cfg.kv_tokens)["b"]
    lo, hi = bound
    assert lo <= share_b <= hi, share_b


def test_batch_first_token_within_the_bound_under_another_tenants_realtime_flood():
    cfg = SchedulerConfig(max_batch=4, kv_tokens=20_000, step_tokens=256, min_quantum_steps=4)
    b = TraceRequest(10.25, "t", BATCH, 100, 40)  # the flood is under way
    # One realtime request a step; the engine serves ~0.2 a step: saturated.
    flood = [TraceRequest(0.5 + i, "flood", RequestClass.REALTIME, 30, 20) for i in range(1_500)]
    bound = first_token_bound_s(cfg, UNIT, prompt=100, other_prompt=30, other_output=20)
    assert bound < 1_500  # the flood outlasts the bound

    def first_token_of_b(policy):
        trace = sorted([*flood, b], key=lambda r: r.arrival_s)
        records = simulate(trace, policy, config=cfg, cost=UNIT).records
        rec = next(r for r in records if r.request_class is BATCH)
        return rec.first_token_s - rec.arrival_s

    assert first_token_of_b("fsched") <= bound
    assert first_token_of_b("priority") > 1_500  # strict priority starves it until the flood ends


def test_a_tenants_own_realtime_flood_goes_before_its_batch():
    """Class precedence inside a share: alone, a tenant's realtime work is all
    within its share, so its batch waits for it (no bound is promised there)."""
    cfg = SchedulerConfig(max_batch=4, kv_tokens=20_000, step_tokens=256, min_quantum_steps=4)
    b = TraceRequest(10.25, "t", BATCH, 100, 40)  # the flood is under way
    flood = [TraceRequest(0.5 + i, "t", RequestClass.REALTIME, 30, 20) for i in range(300)]
    trace = sorted([*flood, b], key=lambda r: r.arrival_s)
    records = simulate(trace, "fsched", config=cfg, cost=UNIT).records
    rec = next(r for r in records if r.request_class is BATCH)
    assert rec.first_token_s > 250


def test_weights_hold_when_work_arrives_over_time_and_waits_long():
    """As a daemon feeds the scheduler: each tenant's waiting work is topped up as it is
    served, so the less-served tenant's requests wait longer (past the batch target):
    waiting alone does not let them overtake the weights."""
    # Short outputs: a (12 of 16 slots) waits ~10 steps; b (4 slots) waits ~30, past the target.
    config = SchedulerConfig(max_batch=16, kv_tokens=100_000, step_tokens=512, batch_target_s=20.0)
    sched = Scheduler(config, "fsched", {"a": 3, "b": 1})
    rng = random.Random(4)
    counter = {"a": 0, "b": 0}
    outputs: dict[str, int] = {}

    def top_up(now: float) -> None:
        waiting = defaultdict(int)
        for r in sched.waiting():
            waiting[r.tenant] += 1
        for tenant in ("a", "b"):
            for _ in range(16 - waiting[tenant]):
                counter[tenant] += 1
                rid = f"{tenant}{counter[tenant]}"
                outputs[rid] = rng.randint(6, 10)
                sched.add(
                    Request(
                        rid,
                        tenant,
                        BATCH,
                        prompt_tokens=rng.randint(8, 64),
                        max_tokens=outputs[rid],
                        arrival=now,
                    )
                )

    log, now = [], 0.0
    for _ in range(400):  # 400 s at one second a step: 20 aging periods
        top_up(now)
        plan = sched.schedule(now)
        finished = {rid for rid in plan.decode if sched.running[rid].generated + 1 >= outputs[rid]}
        finished |= {
            c.request_id
            for c in plan.prefill
            if c.produces_token and sched.running[c.request_id].generated + 1 >= outputs[c.request_id]
        }
        now += 1.0
        charges = sched.postprocess(plan, Outcome(1.0, frozenset(finished)), now).charges
        log.append(({t: (c.gpu_s, c.kv_token_s) for t, c in charges.items()}, {"a", "b"}))
    for start in range(100, 400, 100):
        share = window_shares(log, start, start + 100, config.kv_tokens)["a"]
        assert share == pytest.approx(0.75, abs=0.05), (start, share)
