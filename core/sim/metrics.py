"""Pure metric functions for the simulator's report."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def jain_index(xs: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes all."""
    if not xs:
        return 1.0
    sq = sum(x * x for x in xs)
    return 1.0 if sq == 0 else sum(xs) ** 2 / (len(xs) * sq)


def dominant_fractions(
    gpu_s: Mapping[str, float], kv_token_s: Mapping[str, float], kv_capacity: float
) -> dict[str, float]:
    """Each tenant's dominant-resource use, normalised so the tenants sum to 1.

    A tenant's dominant use is max(GPU seconds, KV token-seconds / KV
    capacity) over the same period; dividing by the sum makes it a share
    of what the tenants together used, comparable with entitled shares.
    """
    dom = {
        t: max(gpu_s.get(t, 0.0), kv_token_s.get(t, 0.0) / kv_capacity)
        for t in set(gpu_s) | set(kv_token_s)
    }
    total = sum(dom.values())
    return {t: (d / total if total > 0 else 0.0) for t, d in dom.items()}
