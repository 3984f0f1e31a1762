"""`GET /metrics`: Prometheus text, named after vLLM's metrics where they mean the same.

Two sources. The table, read at each scrape (any number of servers report
the same figures): requests waiting and running by tenant and class, tokens
generated, each tenant's entitled and served share, live daemons and their KV
use. And this server's own requests, as histograms: first-token and
end-to-end latency by class, from the rows' timestamps (enqueued, first
token, finished), so they include the time in the queue.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fsched.core.ports.records import DaemonSummary, RequestProgress, newest_live_daemon
from fsched.core.sched.shares import entitled_shares, fairness
from fsched.core.types import RequestClass

if TYPE_CHECKING:
    from fsched.api.state import Backend

PREFIX = "fsched:"
# Buckets of vLLM's time_to_first_token_seconds, up to a batch class's minutes.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


class Metrics:
    def __init__(self, backend: Backend):
        self.backend = backend
        self.registry = CollectorRegistry()
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds",
                              "Time from enqueued to first token, of this server's requests",
                              ["class"], buckets=TTFT_BUCKETS, registry=self.registry)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds",
                             "Time from enqueued to finished, of this server's requests",
                             ["class"], buckets=E2E_BUCKETS, registry=self.registry)
        self.registry.register(_TableCollector(backend))
        # A class's series of each (made when it is first observed: a series exists from then on), not
        # looked up by `labels` at every observation (a lock and a check of the values, twice a request).
        self._ttft: dict[RequestClass, Histogram] = {}
        self._e2e: dict[RequestClass, Histogram] = {}

    def observe(self, request_class: RequestClass, p: RequestProgress) -> None:
        if p.first_token_at is not None:
            _series(self._ttft, self.ttft, request_class).observe(max(0.0, p.first_token_at - p.enqueued_at))
        if p.finished_at is not None:
            _series(self._e2e, self.e2e, request_class).observe(max(0.0, p.finished_at - p.enqueued_at))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _series(made: dict[RequestClass, Histogram], histogram: Histogram, request_class: RequestClass
            ) -> Histogram:
    """`histogram`'s series of `request_class`, made once."""
    series = made.get(request_class)
    if series is None:
        series = made[request_class] = histogram.labels(request_class.value)
    return series


class _TableCollector:
    def __init__(self, backend: Backend):
        self.backend = backend

    def collect(self):
        jobs = self.backend.jobs.list_jobs(include_finished=False)
        waiting, running = Counter(), Counter()
        for job in jobs:
            group = (job.tenant, job.request_class.value)
            waiting[group] += job.counts.num_waiting
            running[group] += job.counts.num_running
        yield _gauge("num_requests_waiting", "Requests waiting (queued or preempted)", waiting)
        yield _gauge("num_requests_running", "Requests held by a daemon", running)
        yield from self._chargeback()
        now = time.time()
        daemons = self.backend.jobs.list_daemons()
        yield from self._shares(newest_live_daemon(daemons, now))
        yield from self._daemons([d for d in daemons if d.alive(now)])

    def _chargeback(self):
        """Per-tenant totals from the jobs' counters, whatever door the work came by."""
        labels = ["tenant", "class"]
        generated = CounterMetricFamily(f"{PREFIX}generation_tokens", "Tokens generated", labels=labels)
        prompt = CounterMetricFamily(f"{PREFIX}prompt_tokens", "Prompt tokens of ended requests",
                                     labels=labels)
        ended = CounterMetricFamily(f"{PREFIX}requests", "Requests ended, by outcome",
                                    labels=[*labels, "outcome"])
        for t in self.backend.serving.tenant_totals():
            group = [t.tenant, t.request_class.value]
            generated.add_metric(group, t.generated_tokens)
            prompt.add_metric(group, t.prompt_tokens)
            for outcome, count in (("done", t.done), ("failed", t.failed), ("cancelled", t.cancelled)):
                ended.add_metric([*group, outcome], count)
        yield from (generated, prompt, ended)

    def _shares(self, newest: DaemonSummary | None):
        tenants = self.backend.jobs.list_tenants()
        weights = {t.name: t.weight for t in tenants}
        active = {t.name for t in tenants if t.queued or t.running}
        entitled = entitled_shares(weights, active)
        family = GaugeMetricFamily(f"{PREFIX}tenant_entitled_share",
                                   "A tenant's weight over the weights of tenants with work",
                                   labels=["tenant"])
        for name, share in entitled.items():
            family.add_metric([name], share)
        yield family
        served = GaugeMetricFamily(f"{PREFIX}tenant_served_share",
                                   "A tenant's recent part of the dominant resource (newest live daemon)",
                                   labels=["tenant"])
        for name, share in (newest.stats.served_share if newest else {}).items():
            served.add_metric([name], float(share))
        yield served
        family = GaugeMetricFamily(
            f"{PREFIX}tenant_fairness_jain",
            "Jain's index over the tenants with work of served over entitled share (newest live daemon's "
            "recent use): 1 when every tenant gets its weight's share", labels=[])
        index = fairness(newest.stats.served_share if newest else {}, weights, active)
        if index is not None:
            family.add_metric([], index)
        yield family

    def _daemons(self, live: list[DaemonSummary]):
        alive = GaugeMetricFamily(f"{PREFIX}daemons_alive", "Daemons with a fresh heartbeat")
        alive.add_metric([], len(live))
        yield alive
        yield from _attainment(live)
        yield from _preemption_cost(live)
        kv = GaugeMetricFamily(f"{PREFIX}kv_cache_usage_perc", "KV cache in use over its budget, per daemon",
                               labels=["daemon"])
        preempted = CounterMetricFamily(f"{PREFIX}num_preemptions", "Preemptions since the daemon started",
                                        labels=["daemon"])
        for d in live:
            s = d.stats
            kv.add_metric([d.id], s.kv_tokens / s.kv_budget if s.kv_budget else 0.0)
            preempted.add_metric([d.id], s.preemptions)
        yield kv
        yield preempted


def _attainment(live: list[DaemonSummary]):
    """First tokens and those on target, per daemon, tenant and class: divide the rates for a
    tenant's SLO attainment over any window."""
    labels = ["daemon", "tenant", "class"]
    first = CounterMetricFamily(f"{PREFIX}first_tokens", "First tokens produced since the daemon started",
                                labels=labels)
    on_target = CounterMetricFamily(
        f"{PREFIX}first_tokens_on_target",
        "First tokens within their class's target, counted from when the request entered the table",
        labels=labels)
    for d in live:
        for tenant, classes in sorted(d.stats.first_tokens.items()):
            for request_class, (n, on) in sorted(classes.items()):
                first.add_metric([d.id, tenant, request_class], n)
                on_target.add_metric([d.id, tenant, request_class], on)
    yield first
    yield on_target


def _preemption_cost(live: list[DaemonSummary]):
    """Tokens computed and what preemptions recomputed or parked, per daemon: their rates' ratio is
    preemption's cost."""
    computed = CounterMetricFamily(f"{PREFIX}tokens_computed", "Prefill and decode tokens computed",
                                   labels=["daemon"])
    preempted = CounterMetricFamily(f"{PREFIX}tokens_preempted",
                                    "KV tokens preemptions dropped (recompute) or copied to the host (park)",
                                    labels=["daemon", "checkpoint"])
    for d in live:
        s = d.stats
        computed.add_metric([d.id], s.tokens_computed)
        preempted.add_metric([d.id, "recompute"], s.tokens_recomputed)
        preempted.add_metric([d.id, "park"], s.tokens_parked)
    yield computed
    yield preempted


def _gauge(name: str, doc: str, values: Counter) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}{name}", doc, labels=["tenant", "class"])
    for (tenant, request_class), value in sorted(values.items()):
        family.add_metric([tenant, request_class], value)
    return family
