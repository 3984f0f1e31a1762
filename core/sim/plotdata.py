"""The figures `fsched simulate --plot` draws, as plain data: pure, no plotting library.

Per policy: the first-token latency CDF of each class, each tenant's served
share over time beside its entitled share, and the queues over time.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsched.core.sim.report import PolicyReport
from fsched.core.sim.timeline import SHARE_WINDOW_BINS
from fsched.core.types import RequestClass

# Points a CDF is drawn with: quantiles, so the file stays small for any trace.
CDF_POINTS = 400
# The smallest latency a log axis shows: a first token faster than this is drawn at it.
MIN_LATENCY_S = 1e-3


def latency_cdf(values: Sequence[float], points: int = CDF_POINTS) -> tuple[list[float], list[float]]:
    """(latencies, fraction of requests at or below each), at most `points` of them."""
    xs = sorted(max(v, MIN_LATENCY_S) for v in values)
    n = len(xs)
    if n == 0:
        return [], []
    picks = range(n) if n <= points else sorted({round(i * (n - 1) / (points - 1)) for i in range(points)})
    return [xs[i] for i in picks], [(i + 1) / n for i in picks]


def policy_plot(report: PolicyReport, kv_capacity: float) -> dict:
    """One policy's three figures."""
    by_class: dict[str, list[float]] = {}
    for r in report.records:
        by_class.setdefault(r.request_class.value, []).append(r.first_token_s - r.arrival_s)
    cdf = {}
    for c in RequestClass:
        if c.value in by_class:
            x, y = latency_cdf(by_class[c.value])
            cdf[c.value] = {"x": x, "y": y}
    timeline = report.timeline
    tenants = sorted(report.tenants)
    out = {"policy": report.policy, "cdf": cdf, "time": [], "shares": {}, "entitled": {}, "waiting": {},
           "running": [], "window_s": 0.0}
    if timeline is not None:
        out.update(
            time=[round(t, 3) for t in timeline.times()],
            shares=_rounded(timeline.served_shares(tenants, kv_capacity)),
            entitled=_rounded(timeline.entitled_shares({t: report.tenants[t].weight for t in tenants})),
            waiting={c.value: timeline.waiting(c) for c in RequestClass if c.value in by_class},
            running=timeline.running(),
            window_s=round(timeline.bin_s * SHARE_WINDOW_BINS, 3),
        )
    return out


def _rounded(series: dict[str, list[float | None]]) -> dict[str, list[float | None]]:
    return {t: [None if v is None else round(v, 4) for v in values] for t, values in series.items()}


def plot_data(title: str, reports: Sequence[PolicyReport], kv_capacity: float) -> dict:
    """Everything a plot of one comparison needs, JSON-ready."""
    return {"title": title, "policies": [policy_plot(r, kv_capacity) for r in reports]}
