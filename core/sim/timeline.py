"""What a simulated run looked like over time, in fixed bins: the figures `--plot` draws.

Each bin of `bin_s` seconds of simulated time holds what the engine
charged each tenant in it (so a tenant's served share over any run of bins
is the one definition in `core.sched.shares`), and the queues as the last
step in it left them: requests waiting by class, requests running.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fsched.core.sched.shares import entitled_shares, served_shares
from fsched.core.sched.usage import TenantCharge
from fsched.core.types import RequestClass

# Bins a run is cut into, about: enough for a curve, few enough for a small file.
TARGET_BINS = 240
# A served share over time is taken over this many bins: one bin alone holds a few steps.
SHARE_WINDOW_BINS = 10


@dataclass(slots=True)
class Bin:
    usage: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    waiting: dict[str, int] = field(default_factory=dict)  # class -> requests waiting at the bin's end
    running: int = 0
    active: set[str] = field(default_factory=set)  # tenants with work waiting or running in the bin
    stepped: bool = False  # whether a step ended in it (else it carries the previous bin's figures)


@dataclass(slots=True)
class Timeline:
    bin_s: float
    bins: list[Bin] = field(default_factory=list)

    @classmethod
    def for_span(cls, span_s: float) -> Timeline:
        """A timeline whose bins cut a run of about `span_s` seconds into `TARGET_BINS`."""
        return cls(bin_s=max(span_s / TARGET_BINS, 1e-3))

    def _bin(self, t: float) -> Bin:
        index = max(0, int(t / self.bin_s))
        while len(self.bins) <= index:
            previous = self.bins[-1] if self.bins else None
            # A bin no step ended in keeps the queues the last step left.
            self.bins.append(Bin(waiting=dict(previous.waiting) if previous else {},
                                 running=previous.running if previous else 0,
                                 active=set(previous.active) if previous else set()))
        return self.bins[index]

    def record(self, end_s: float, charges: Mapping[str, TenantCharge], waiting: Mapping[RequestClass, int],
               running: int, active: Iterable[str]) -> None:
        """One engine step (or a run of repeated ones) that ended at `end_s`, with the tenants that had
        work in it."""
        b = self._bin(end_s)
        if not b.stepped:
            b.active, b.stepped = set(), True
        b.active.update(active)
        for tenant, charge in charges.items():
            b.usage[tenant][0] += charge.gpu_s
            b.usage[tenant][1] += charge.kv_token_s
        b.waiting = {c.value: n for c, n in waiting.items()}
        b.running = running

    def times(self) -> list[float]:
        """Each bin's end, in seconds of simulated time."""
        return [(i + 1) * self.bin_s for i in range(len(self.bins))]

    def served_shares(self, tenants: list[str], kv_capacity: float,
                      window: int = SHARE_WINDOW_BINS) -> dict[str, list[float | None]]:
        """Each tenant's served share over the `window` bins ending at each bin (None where nobody was
        served in them): the same definition the report's overall share uses."""
        out: dict[str, list[float | None]] = {t: [] for t in tenants}
        for i in range(len(self.bins)):
            usage: dict[str, tuple[float, float]] = {}
            for b in self.bins[max(0, i - window + 1): i + 1]:
                for t, (gpu, kv) in b.usage.items():
                    g, k = usage.get(t, (0.0, 0.0))
                    usage[t] = (g + gpu, k + kv)
            shares = served_shares(usage, kv_capacity)
            for t in tenants:
                out[t].append(shares.get(t, 0.0) if shares else None)
        return out

    def entitled_shares(self, weights: Mapping[str, float]) -> dict[str, list[float | None]]:
        """Each tenant's entitled share in each bin: its weight over the weights of the tenants with
        work then (None while it has none)."""
        out: dict[str, list[float | None]] = {t: [] for t in weights}
        for b in self.bins:
            shares = entitled_shares(weights, b.active)
            for t in weights:
                out[t].append(shares[t] if t in b.active else None)
        return out

    def waiting(self, request_class: RequestClass) -> list[int]:
        return [b.waiting.get(request_class.value, 0) for b in self.bins]

    def running(self) -> list[int]:
        return [b.running for b in self.bins]
