"""First tokens per tenant and class, and how many came within the class's target: what `/metrics`,
`fsched status` and the dashboard show as each tenant's live SLO attainment.

Counted by the engine that produced the first token, from when the request entered the table (its
time in the queue counts, as the first-token histograms count it), since the daemon started: so
they are counters, and a Grafana panel divides `on target` by `first tokens` over any window. A
request resumed after a restart with its first token already out is not counted again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from fsched.core.types import RequestClass


class FirstTokenTally:
    __slots__ = ("first", "on_target")

    def __init__(self) -> None:
        self.first: Counter[tuple[str, RequestClass]] = Counter()
        self.on_target: Counter[tuple[str, RequestClass]] = Counter()

    def record(self, tenant: str, request_class: RequestClass, waited_s: float, target_s: float) -> None:
        """A first token `waited_s` after its request entered the table."""
        self.first[tenant, request_class] += 1
        if waited_s <= target_s:
            self.on_target[tenant, request_class] += 1

    def to_json(self) -> dict[str, dict[str, list[int]]]:
        """{tenant: {class: [first tokens, on target]}}."""
        out: dict[str, dict[str, list[int]]] = {}
        for (tenant, request_class), n in sorted(self.first.items()):
            out.setdefault(tenant, {})[request_class.value] = [n, self.on_target[tenant, request_class]]
        return out


def merged(tallies: Iterable[Mapping[str, Mapping[str, list[int]]]]) -> dict[str, dict[str, list[int]]]:
    """Several daemons' tallies (`to_json`'s shape) summed, tenant by tenant and class by class."""
    out: dict[str, dict[str, list[int]]] = {}
    for tally in tallies:
        for tenant, classes in tally.items():
            mine = out.setdefault(tenant, {})
            for request_class, (first, on) in classes.items():
                was = mine.get(request_class, [0, 0])
                mine[request_class] = [was[0] + first, was[1] + on]
    return out


def attainment(tally: Mapping[str, Mapping[str, list[int]]]) -> dict[str, dict[str, float | None]]:
    """Each tenant's fraction on target per class (None before any first token)."""
    return {tenant: {c: (on / first if first else None) for c, (first, on) in classes.items()}
            for tenant, classes in tally.items()}
