"""The dashboard's charts over time: samples of the table's aggregate figures, kept in memory.

A server samples only while someone watches (a dashboard read in the last
`idle_s`), every `sample_s`, and keeps `keep_s` of samples: a page opened
later shows the last quarter of an hour at once. Each server keeps its own;
every figure in a sample is the table's, the same whichever server took it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fsched.api.dashboard_view import CLASSES, Facts, entitled, queues, stats_json, ttft

SAMPLE_S = 2.0
KEEP_S = 900.0
IDLE_S = 300.0
# First-token percentiles (now and over time) are taken over the first tokens of this many seconds.
TTFT_WINDOW_S = 60.0


@dataclass(slots=True)
class History:
    sample_s: float = SAMPLE_S
    keep_s: float = KEEP_S
    idle_s: float = IDLE_S
    samples: deque = field(default_factory=deque)
    last_view: float = -1e18
    _generated: dict[str, int] = field(default_factory=dict)  # tenant -> tokens at the last sample
    _generated_at: float | None = None

    def viewed(self, now: float) -> None:
        self.last_view = now

    def wanted(self, now: float) -> bool:
        """Whether to sample now: someone watched lately, and the last sample is old enough."""
        recent = now - self.last_view <= self.idle_s
        due = not self.samples or now - self.samples[-1]["t"] >= self.sample_s * 0.95
        return recent and due

    def add(self, facts: Facts) -> dict:
        """Take one sample of `facts` (read for no viewer in particular)."""
        sample = sample_of(facts, self._rates(facts))
        self.samples.append(sample)
        while self.samples and facts.now - self.samples[0]["t"] > self.keep_s:
            self.samples.popleft()
        return sample

    def _rates(self, facts: Facts) -> dict[str, float]:
        """Tokens a second per tenant since the last sample (from the table's counters)."""
        generated: dict[str, int] = {}
        for t in facts.totals:
            generated[t.tenant] = generated.get(t.tenant, 0) + t.generated_tokens
        rates = {}
        if self._generated_at is not None and facts.now > self._generated_at:
            dt = facts.now - self._generated_at
            rates = {t: max(0, n - self._generated.get(t, n)) / dt for t, n in generated.items()}
        self._generated, self._generated_at = generated, facts.now
        return rates


def sample_of(facts: Facts, rates: dict[str, float]) -> dict:
    """One point of every chart."""
    waiting = dict.fromkeys(CLASSES, 0)
    running = dict.fromkeys(CLASSES, 0)
    for q in queues(facts.jobs):
        waiting[q["class"]] += q["waiting"]
        running[q["class"]] += q["running"]
    latency = ttft(facts.first_tokens)
    live = [stats_json(d) for d in facts.live]
    kv = [s["kv_tokens"] / s["kv_budget"] for s in live if s.get("kv_budget")]
    active = {t.name for t in facts.tenants if t.queued or t.running}
    return {
        "t": facts.now,
        "entitled": {name: round(share, 4) for name, share in entitled(facts.tenants).items()
                     if name in active},
        "served": dict(facts.served),
        "waiting": waiting,
        "running": running,
        "ttft_p50": {c: v["p50"] for c, v in latency.items()},
        "ttft_p99": {c: v["p99"] for c, v in latency.items()},
        "tok_s": round(sum(s.get("tok_s") or 0 for s in live), 1),
        "tok_s_by_tenant": {t: round(r, 1) for t, r in rates.items()},
        "kv_use": max(kv) if kv else None,
        "preemptions": sum(s.get("preemptions") or 0 for s in live),
        "daemons_alive": len(live),
    }
