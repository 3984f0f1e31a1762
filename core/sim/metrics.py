"""Pure metric functions for the simulator's report."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fsched.core.sched.shares import jain_index

__all__ = ["jain_index", "percentile"]


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
