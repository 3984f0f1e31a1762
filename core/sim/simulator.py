"""Event-driven replay of a trace through the real Scheduler and a cost model.

Each loop turn is one `schedule()` / `postprocess()` pair, exactly as the
engine drives it. A decode-only plan is repeated for as many steps as
nothing can change: the scheduler says how many (`plan.stable_steps`:
quantum and minimum-quantum expiries, KV pressure, max_tokens) and when
aging next matters (`plan.wakeup_at`); the simulator adds the next arrival
and the next completion. So the loop turns once per decision, not once
per token.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome, Plan
from fsched.core.sched.request import SchedRequest
from fsched.core.sched.scheduler import Scheduler
from fsched.core.sched.shares import entitled_shares
from fsched.core.sim.costmodel import CostModel
from fsched.core.sim.metrics import dominant_fractions, jain_index, percentile
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass


@dataclass(slots=True)
class ClassStats:
    count: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    jct_p50_s: float | None
    jct_p99_s: float | None
    max_wait_s: float = 0.0  # not in the JSON schema; the bench reads it


@dataclass(slots=True)
class TenantStats:
    weight: float
    entitled: float
    share: float


@dataclass(slots=True, frozen=True)
class RequestRecord:
    """One request as the simulator saw it (trace order)."""

    tenant: str
    cls: RequestClass
    arrival_s: float
    first_token_s: float
    finish_s: float
    output_tokens: int
    max_wait_s: float


@dataclass(slots=True)
class PolicyReport:
    policy: str
    classes: dict[str, ClassStats]
    throughput_tok_s: float
    tenants: dict[str, TenantStats]
    jain_index: float
    max_wait_s: float
    preemptions: int
    makespan_s: float
    # Diagnostics outside the JSON schema.
    decisions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    backlogged_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "classes": {
                name: {
                    "count": c.count,
                    "ttft_p50_s": c.ttft_p50_s,
                    "ttft_p99_s": c.ttft_p99_s,
                    "tpot_p50_s": c.tpot_p50_s,
                    "tpot_p99_s": c.tpot_p99_s,
                    "jct_p50_s": c.jct_p50_s,
                    "jct_p99_s": c.jct_p99_s,
                }
                for name, c in self.classes.items()
            },
            "throughput_tok_s": self.throughput_tok_s,
            "tenants": {
                name: {"weight": t.weight, "entitled": t.entitled, "share": t.share}
                for name, t in self.tenants.items()
            },
            "jain_index": self.jain_index,
            "max_wait_s": self.max_wait_s,
            "preemptions": self.preemptions,
            "makespan_s": self.makespan_s,
        }


@dataclass(slots=True)
class _Track:
    """What the simulator observes about one request."""

    req: TraceRequest
    first_token_s: float | None = None
    finish_s: float | None = None
    wait_start: float = 0.0
    max_wait_s: float = 0.0


@dataclass(slots=True)
class _Usage:
    gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    kv_token_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    seconds: float = 0.0


def simulate(
    trace: Sequence[TraceRequest],
    policy: str,
    *,
    weights: Mapping[str, float] | None = None,
    config: SchedulerConfig | None = None,
    cost: CostModel | None = None,
    jump: bool = True,
    observer: Callable[[float, Plan, Scheduler], None] | None = None,
) -> PolicyReport:
    """Replay `trace` (sorted by arrival) under `policy`; simulated time only.

    `jump=False` runs every engine step on its own (the reference the
    event-driven skipping is tested against); `observer(now, plan, sched)`
    sees every plan before it runs (tests check budgets with it).
    """
    config = config or SchedulerConfig()
    cost = cost or CostModel()
    weights = dict(weights or {})
    tenants = sorted({r.tenant for r in trace})  # the ones with work; weights may name more
    for t in tenants:
        weights.setdefault(t, config.default_weight)
    sched = Scheduler(config, policy, weights)
    tracks: dict[str, _Track] = {}
    waiting_by_tenant: Counter[str] = Counter()
    backlog = _Usage()  # usage while every tenant had work waiting
    whole = _Usage()
    now, i, n = 0.0, 0, len(trace)
    decisions = busy_s = 0.0
    while True:
        while i < n and trace[i].arrival_s <= now:
            req = trace[i]
            rid = str(i)
            sched.add(
                SchedRequest(
                    rid, req.tenant, req.cls, req.prompt_tokens, req.output_tokens,
                    req.arrival_s, priority=req.priority,
                )
            )
            tracks[rid] = _Track(req, wait_start=req.arrival_s)
            waiting_by_tenant[req.tenant] += 1
            i += 1
        plan = sched.schedule(now)
        decisions += 1
        if observer is not None:
            observer(now, plan, sched)
        for p in plan.preempted:
            tracks[p.request_id].wait_start = now
            waiting_by_tenant[tracks[p.request_id].req.tenant] += 1
        for rid in plan.admitted:
            tr = tracks[rid]
            tr.max_wait_s = max(tr.max_wait_s, now - tr.wait_start)
            waiting_by_tenant[tr.req.tenant] -= 1
        if plan.empty:
            if i < n:
                now = max(now, trace[i].arrival_s)
                continue
            if sched.waiting_count or sched.running:
                raise RuntimeError("simulation stuck: work left but nothing schedulable")
            break
        # The trace's output length is the request's max_tokens, so the
        # scheduler's stable_steps already stops at the next completion.
        steps = plan.stable_steps if jump else 1
        if steps > 1:
            t_next = min(trace[i].arrival_s if i < n else math.inf, plan.wakeup_at)
            if t_next < math.inf:
                steps = min(
                    steps, cost.decode_steps_within(t_next - now, len(plan.decode), plan.kv_tokens)
                )
            elapsed = cost.decode_run_s(steps, len(plan.decode), plan.kv_tokens)
        else:
            elapsed = cost.step_s(plan.tokens, plan.kv_tokens, plan.swap_tokens)
        end = now + elapsed
        for c in plan.prefill:
            if c.produces_token:
                tr = tracks[c.request_id]
                if tr.first_token_s is None:
                    tr.first_token_s = end
        backlogged = all(waiting_by_tenant[t] > 0 for t in tenants)
        result = sched.postprocess(plan, Outcome(elapsed, steps=steps), end)
        for usage in (whole, backlog) if backlogged else (whole,):
            usage.seconds += elapsed
            for t, ch in result.charges.items():
                usage.gpu_s[t] += ch.gpu_s
                usage.kv_token_s[t] += ch.kv_token_s
        for rid in result.finished:
            tracks[rid].finish_s = end
        busy_s += elapsed
        now = end
    report = _report(policy, tracks, tenants, weights, backlog, whole, config, sched, now)
    report.decisions = int(decisions)
    report.steps = sched.step
    report.busy_s = busy_s
    return report


def _report(policy, tracks, tenants, weights, backlog, whole, config, sched, makespan):
    by_class: dict[RequestClass, list[_Track]] = defaultdict(list)
    for tr in tracks.values():
        by_class[tr.req.cls].append(tr)
    classes = {}
    for cls in RequestClass:
        trs = by_class.get(cls, [])
        if not trs:
            continue
        ttft = [tr.first_token_s - tr.req.arrival_s for tr in trs]
        jct = [tr.finish_s - tr.req.arrival_s for tr in trs]
        tpot = [
            (tr.finish_s - tr.first_token_s) / (tr.req.output_tokens - 1)
            for tr in trs
            if tr.req.output_tokens > 1
        ]
        classes[cls.value] = ClassStats(
            count=len(trs),
            ttft_p50_s=percentile(ttft, 50),
            ttft_p99_s=percentile(ttft, 99),
            tpot_p50_s=percentile(tpot, 50),
            tpot_p99_s=percentile(tpot, 99),
            jct_p50_s=percentile(jct, 50),
            jct_p99_s=percentile(jct, 99),
            max_wait_s=max(tr.max_wait_s for tr in trs),
        )
    usage = backlog if backlog.seconds > 0 else whole
    shares = dominant_fractions(usage.gpu_s, usage.kv_token_s, config.kv_tokens)
    # Entitled: weight over the weights of the tenants with work (DESIGN
    # §2); a configured tenant without requests is listed with the share it
    # would get, and left out of Jain's index.
    entitled = entitled_shares(weights, tenants)
    tenant_stats = {
        t: TenantStats(weights[t], entitled[t], shares.get(t, 0.0)) for t in sorted(weights)
    }
    jain = jain_index([tenant_stats[t].share / tenant_stats[t].entitled for t in tenants])
    out_tokens = sum(tr.req.output_tokens for tr in tracks.values())
    return PolicyReport(
        policy=policy,
        classes=classes,
        throughput_tok_s=out_tokens / makespan if makespan > 0 else 0.0,
        tenants=tenant_stats,
        jain_index=jain,
        max_wait_s=max((tr.max_wait_s for tr in tracks.values()), default=0.0),
        preemptions=sched.preemptions,
        makespan_s=makespan,
        backlogged_s=backlog.seconds,
        records=[
            RequestRecord(
                tr.req.tenant, tr.req.cls, tr.req.arrival_s, tr.first_token_s, tr.finish_s,
                tr.req.output_tokens, tr.max_wait_s,
            )
            for tr in tracks.values()
        ],
    )
