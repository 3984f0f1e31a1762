"""Shares of the machine: what a tenant is entitled to and what it was served.

One definition of the dominant share, used by the scheduler (to order
tenants), the simulator (to report and to compute Jain's index) and the
daemon's status figure:

* A tenant's **dominant use** over a window is the larger of its fractions
  of the two resources' capacity over that window: compute (GPU seconds
  over the window's seconds, one GPU) and KV memory (token-slots held x
  seconds over the KV budget x the window's seconds). Dividing by capacity,
  not by what the tenants together used, keeps a tenant's figure
  independent of how busy the others are, and makes the two resources
  comparable (a tenant that holds half the KV cache for the whole window
  uses half of that resource, whatever the compute does).
* A tenant's **served share** is its dominant use over the sum of the
  dominant uses of the tenants considered, so the shares sum to 1 and read
  directly against the entitled shares (weight over the weights of the
  tenants with work). The window length divides out of that ratio, so it
  can be computed from decayed totals as well as from a fixed window.
* The scheduler's **score** of a tenant is its dominant use over its
  weight: equal scores are exactly the weighted split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def dominant_use(gpu_s: float, kv_token_s: float, kv_capacity: float, window_s: float = 1.0) -> float:
    """The larger of a tenant's fractions of compute and of KV capacity over `window_s`."""
    if kv_capacity <= 0 or window_s <= 0:
        raise ValueError("kv_capacity and window_s must be > 0")
    return max(gpu_s, kv_token_s / kv_capacity) / window_s


def weighted_score(gpu_s: float, kv_token_s: float, kv_capacity: float, weight: float) -> float:
    """Dominant use over weight: the order of tenants (lower is further below its share)."""
    return dominant_use(gpu_s, kv_token_s, kv_capacity) / weight


def served_shares(usage: Mapping[str, tuple[float, float]], kv_capacity: float) -> dict[str, float]:
    """Each tenant's served share: its dominant use over the tenants' total (sums to 1).

    `usage` maps a tenant to (GPU seconds, KV token-seconds) over one
    window (or decayed alike); an empty or all-zero usage gives {}.
    """
    dom = {t: dominant_use(gpu, kv, kv_capacity) for t, (gpu, kv) in usage.items()}
    total = sum(dom.values())
    return {t: d / total for t, d in dom.items()} if total > 0 else {}


def entitled_shares(weights: Mapping[str, float], active: Iterable[str]) -> dict[str, float]:
    """Each active tenant's fair fraction of the machine: its weight over the active weights.

    Inactive tenants get the share they *would* get if they became active
    now, so a listing can show it; active shares sum to 1.
    """
    active = set(active)
    active_total = sum(weights[name] for name in active if name in weights)
    shares: dict[str, float] = {}
    for name, weight in weights.items():
        total = active_total if name in active else active_total + weight
        shares[name] = weight / total if total > 0 else 0.0
    return shares


def jain_index(xs: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes all."""
    if not xs:
        return 1.0
    sq = sum(x * x for x in xs)
    return 1.0 if sq == 0 else sum(xs) ** 2 / (len(xs) * sq)


def fairness(served: Mapping[str, float], weights: Mapping[str, float],
             active: Iterable[str]) -> float | None:
    """Jain's index over the `active` tenants of served over entitled share (1 when each gets its
    weight's share); None with no active tenant or no served share to judge."""
    active = [t for t in active if t in weights]
    if not active or not served:
        return None
    entitled = entitled_shares(weights, active)
    return jain_index([served.get(t, 0.0) / entitled[t] for t in active])

