"""Entitled shares: a tenant's weight over the weights of the tenants with work."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def entitled_shares(weights: Mapping[str, float], active: Iterable[str]) -> dict[str, float]:
    """Each active tenant's fair fraction of the machine (DESIGN §2).

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
