"""What a simulated run reports: per class, per tenant and per tenant and class, as figures and JSON."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fsched.core.sched.accounting import WorkTally
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.shares import entitled_shares, served_shares
from fsched.core.sched.usage import TenantCharge
from fsched.core.sim.metrics import jain_index, percentile
from fsched.core.sim.timeline import Timeline
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass


@dataclass(slots=True)
class Track:
    """What the simulator observes about one request."""

    req: TraceRequest
    first_token_s: float | None = None
    finish_s: float | None = None
    wait_start: float = 0.0
    max_wait_s: float = 0.0

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.req.arrival_s

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.req.arrival_s


@dataclass(slots=True)
class UsageWindow:
    """GPU seconds and KV token-seconds per tenant over some seconds of engine time."""

    gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    kv_token_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    seconds: float = 0.0

    def add(self, elapsed_s: float, charges: Mapping[str, TenantCharge]) -> None:
        self.seconds += elapsed_s
        for t, ch in charges.items():
            self.gpu_s[t] += ch.gpu_s
            self.kv_token_s[t] += ch.kv_token_s

    def usage(self) -> dict[str, tuple[float, float]]:
        tenants = set(self.gpu_s) | set(self.kv_token_s)
        return {t: (self.gpu_s.get(t, 0.0), self.kv_token_s.get(t, 0.0)) for t in tenants}


@dataclass(slots=True)
class ClassStats:
    count: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    jct_p50_s: float | None
    jct_p99_s: float | None
    max_wait_s: float = 0.0
    on_target: float = 1.0  # fraction whose first token came within the class's target (attainment)
    goodput_per_s: float = 0.0  # requests on target per second of the run

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class TenantStats:
    weight: float
    entitled: float
    share: float


@dataclass(slots=True, frozen=True)
class RequestRecord:
    """One request as the simulator saw it (trace order)."""

    tenant: str
    request_class: RequestClass
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
    makespan_s: float
    tenant_classes: dict[str, dict[str, ClassStats]] = field(default_factory=dict)
    preemptions: int = 0
    work: WorkTally = field(default_factory=WorkTally)  # tokens computed, and recomputed or parked
    backfilled: int = 0  # requests admitted behind a head that did not fit
    rejected: int = 0  # requests longer than the KV budget, refused on arrival
    # Diagnostics outside the JSON.
    decisions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    backlogged_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)
    timeline: Timeline | None = None  # the run over time, in bins (what --plot draws)

    def to_json(self) -> dict:
        return {
            "classes": {name: c.to_json() for name, c in self.classes.items()},
            "throughput_tok_s": self.throughput_tok_s,
            "tenants": {
                name: {"weight": t.weight, "entitled": t.entitled, "share": t.share,
                       "classes": {c: s.to_json() for c, s in self.tenant_classes.get(name, {}).items()}}
                for name, t in self.tenants.items()
            },
            "jain_index": self.jain_index,
            "max_wait_s": self.max_wait_s,
            "preemptions": self.preemptions,
            "preemption_cost": self.work.preemption_cost,
            "tokens_computed": self.work.computed,
            "tokens_recomputed": self.work.recomputed,
            "tokens_parked": self.work.parked,
            "backfilled": self.backfilled,
            "rejected": self.rejected,
            "makespan_s": self.makespan_s,
        }


def class_stats(tracks: Iterable[Track], target_s: float, makespan_s: float = 0.0) -> ClassStats:
    """Latency figures of one set of finished requests; goodput over `makespan_s` (0: none)."""
    trs = list(tracks)
    ttft = [tr.ttft_s for tr in trs]
    on_target = sum(t <= target_s for t in ttft)
    jct = [tr.jct_s for tr in trs]
    tpot = [(tr.finish_s - tr.first_token_s) / (tr.req.output_tokens - 1) for tr in trs
            if tr.req.output_tokens > 1]
    return ClassStats(
        count=len(trs),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        tpot_p50_s=percentile(tpot, 50),
        tpot_p99_s=percentile(tpot, 99),
        jct_p50_s=percentile(jct, 50),
        jct_p99_s=percentile(jct, 99),
        max_wait_s=max((tr.max_wait_s for tr in trs), default=0.0),
        on_target=on_target / len(ttft) if ttft else 1.0,
        goodput_per_s=on_target / makespan_s if makespan_s > 0 else 0.0,
    )


def _by_class(tracks: Iterable[Track], config: SchedulerConfig, makespan_s: float) -> dict[str, ClassStats]:
    groups: dict[RequestClass, list[Track]] = defaultdict(list)
    for tr in tracks:
        groups[tr.req.request_class].append(tr)
    return {c.value: class_stats(groups[c], config.target_s(c), makespan_s)
            for c in RequestClass if groups[c]}


def build_report(policy: str, tracks: Mapping[str, Track], tenants: list[str], weights: Mapping[str, float],
                 usage: UsageWindow, config: SchedulerConfig, makespan: float) -> PolicyReport:
    """The report of one finished run; shares from `usage` (the backlogged window when there was one)."""
    shares = served_shares(usage.usage(), config.kv_tokens)
    # Entitled: weight over the weights of the tenants with work; a configured
    # tenant without requests is listed with the share it would get, and left
    # out of Jain's index.
    entitled = entitled_shares(weights, tenants)
    tenant_stats = {t: TenantStats(weights[t], entitled[t], shares.get(t, 0.0)) for t in sorted(weights)}
    per_tenant: dict[str, list[Track]] = defaultdict(list)
    for tr in tracks.values():
        per_tenant[tr.req.tenant].append(tr)
    out_tokens = sum(tr.req.output_tokens for tr in tracks.values())
    return PolicyReport(
        policy=policy,
        classes=_by_class(tracks.values(), config, makespan),
        throughput_tok_s=out_tokens / makespan if makespan > 0 else 0.0,
        tenants=tenant_stats,
        jain_index=jain_index([tenant_stats[t].share / tenant_stats[t].entitled for t in tenants]),
        max_wait_s=max((tr.max_wait_s for tr in tracks.values()), default=0.0),
        makespan_s=makespan,
        tenant_classes={t: _by_class(trs, config, makespan) for t, trs in per_tenant.items()},
        records=[
            RequestRecord(tr.req.tenant, tr.req.request_class, tr.req.arrival_s, tr.first_token_s,
                          tr.finish_s, tr.req.output_tokens, tr.max_wait_s)
            for tr in tracks.values()
        ],
    )
