"""Ordering policies behind one small interface, made by name (DESIGN §7.3).

A policy says how requests are ordered, never what the batch holds; the
mechanism in `scheduler.py` is the same for all four.

* Waiting requests sit in per-group heaps (`group`, `heap_key`). Everything
  in a group shares the parts of the rank that do not change over time, so
  the heap order stays valid while tenants' scores and requests' ages move;
  once a request is fully aged (`settles_at`) it moves to the group's
  second heap, ordered by arrival, so a preempted request (reset wait,
  old arrival) regains its place in line instead of queueing behind every
  younger request that has waited longer. The best waiting request is the
  best group head, found by `rank` in O(groups) plus O(log n) a pop.
* `rank` is the total order (smaller first): fsched's is
  (aged band, tenant score, aged MLFQ level, aged priority, arrival, seq).
  It is `compose(static_rank, score)`: the part that does not depend on
  the tenant's score, and the score of the request's `partition` (its
  tenant). Within a partition the static part alone orders the requests,
  so the queue keeps one heap of group heads per tenant and a pick costs
  O(tenants) plus heap operations.
* `may_preempt` says whether a waiting request may displace a running
  victim (the mechanism picks the victim: the last running one by
  `running_rank` that has run its minimum quantum). It compares the
  requests' own class and level, not their aged ones: aging orders the
  wait queue (who takes the next free slot), it does not let a waiting
  batch request evict a running one of its own class. With aged
  preemption every aged request evicted a younger one of the same class
  under overload and the engine thrashed (measured on the Azure trace at
  2x: 712,956 preemptions, throughput 142 vs 1,746 tok/s for fcfs).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Protocol

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import SchedRequest
from fsched.core.sched.usage import DrfMeter, NullMeter, TenantMeter, VtcMeter
from fsched.core.types import RequestClass

INF = float("inf")


def aged(band: int, level: int, priority: int, waited_s: float, aging_s: float):
    """(band, level, priority) of a request that has waited `waited_s` since it last ran.

    The band improves by one per `aging_s`; one `aging_s` after reaching the
    top band the level and base priority are boosted to the top as well, so
    the request then loses only to its tenant's older work and to tenants
    with a lower share.
    """
    steps = int(waited_s // aging_s) if waited_s > 0 else 0
    if steps > band:
        return 0, 0, 0
    return band - steps, level, priority


def next_aging_change(band: int, level: int, priority: int, since: float, now: float,
                      aging_s: float) -> float:
    """Clock time at which `aged(...)` next changes (inf when it never does)."""
    steps = int((now - since) // aging_s) if now > since else 0
    if steps > band or (steps == band and level == 0 and priority == 0):
        return INF  # fully aged already, or the next step changes nothing
    return since + (steps + 1) * aging_s


class Policy(Protocol):
    name: str
    preemptive: bool
    time_slicing: bool
    meter: TenantMeter

    def group(self, r: SchedRequest) -> Hashable: ...
    def heap_key(self, r: SchedRequest) -> tuple: ...
    def settles_at(self, r: SchedRequest) -> float: ...
    def partition(self, r: SchedRequest) -> str: ...
    def static_rank(self, r: SchedRequest, now: float) -> tuple: ...
    def compose(self, static: tuple, score: float) -> tuple: ...
    def rank(self, r: SchedRequest, now: float, scores: Mapping[str, float]) -> tuple: ...
    def running_rank(self, r: SchedRequest, scores: Mapping[str, float]) -> tuple: ...
    def may_preempt(self, waiter: SchedRequest, victim: SchedRequest) -> bool: ...
    def preempts_within(self, band: int, victim: SchedRequest | None = None) -> bool: ...
    def next_change(self, r: SchedRequest, now: float) -> float: ...
    def note_admitted(self, r: SchedRequest, now: float) -> None: ...
    def aging_since(self, r: SchedRequest) -> float: ...


class Fcfs:
    """Arrival order, no preemption, no tenants."""

    name = "fcfs"
    preemptive = False
    time_slicing = False

    def __init__(self, config: SchedulerConfig, weights: Mapping[str, float]) -> None:
        self.meter = NullMeter(weights, config.default_weight)

    def group(self, r: SchedRequest) -> Hashable:
        return ()

    def heap_key(self, r: SchedRequest) -> tuple:
        return (r.arrival, r.seq)

    def settles_at(self, r: SchedRequest) -> float:
        return INF  # ranks never change with time: heap_key order is final

    def partition(self, r: SchedRequest) -> str:
        return ""  # no tenants: one partition

    def static_rank(self, r: SchedRequest, now: float) -> tuple:
        return (r.arrival, r.seq)

    def compose(self, static: tuple, score: float) -> tuple:
        return static

    def rank(self, r: SchedRequest, now: float, scores: Mapping[str, float]) -> tuple:
        """The total order of waiting requests (smaller first)."""
        return self.compose(self.static_rank(r, now), scores.get(self.partition(r), 0.0))

    def running_rank(self, r: SchedRequest, scores: Mapping[str, float]) -> tuple:
        return (r.arrival, r.seq)

    def may_preempt(self, waiter: SchedRequest, victim: SchedRequest) -> bool:
        return False

    def preempts_within(self, band: int, victim: SchedRequest | None = None) -> bool:
        """Whether a waiter may displace a runner of its own class band
        (that runner, when given)."""
        return False

    def next_change(self, r: SchedRequest, now: float) -> float:
        return INF

    def note_admitted(self, r: SchedRequest, now: float) -> None:
        return None

    def aging_since(self, r: SchedRequest) -> float:
        return r.wait_since


class StrictPriority(Fcfs):
    """Class band, then base priority, then arrival; preempts strictly worse
    running work (vLLM's priority policy). No aging, no tenants."""

    name = "priority"
    preemptive = True

    def group(self, r: SchedRequest) -> Hashable:
        return (r.cls.band, r.priority)

    def static_rank(self, r: SchedRequest, now: float) -> tuple:
        return (r.cls.band, r.priority, r.arrival, r.seq)

    def running_rank(self, r: SchedRequest, scores: Mapping[str, float]) -> tuple:
        return (r.cls.band, r.priority, r.arrival, r.seq)

    def may_preempt(self, waiter: SchedRequest, victim: SchedRequest) -> bool:
        return (waiter.cls.band, waiter.priority) < (victim.cls.band, victim.priority)

    def preempts_within(self, band: int, victim: SchedRequest | None = None) -> bool:
        return victim is None or victim.priority > 0  # by base priority


class Vtc(Fcfs):
    """Virtual Token Counter: the backlogged tenant with the lowest weighted
    counter goes next, its oldest request first; no preemption."""

    name = "vtc"

    def __init__(self, config: SchedulerConfig, weights: Mapping[str, float]) -> None:
        self.meter = VtcMeter(
            weights, default_weight=config.default_weight, lift=config.lift_idle_tenants
        )

    def group(self, r: SchedRequest) -> Hashable:
        return r.tenant

    def partition(self, r: SchedRequest) -> str:
        return r.tenant

    def compose(self, static: tuple, score: float) -> tuple:
        return (score, *static)

    def running_rank(self, r: SchedRequest, scores: Mapping[str, float]) -> tuple:
        return (scores[r.tenant], r.arrival, r.seq)


class FschedPolicy:
    """DESIGN §3: aged bands, weighted DRF, skip-join MLFQ, base priority, arrival."""

    name = "fsched"
    preemptive = True
    time_slicing = True

    def __init__(self, config: SchedulerConfig, weights: Mapping[str, float]) -> None:
        self.aging_s = config.aging_s
        # Group -> when one of its requests was last admitted. A request ages
        # from the later of its own wait start and that moment: a group that
        # is being served (its tenant gets its fair share of admissions) is
        # not starving, so its waiters do not age past other tenants' work;
        # a group that gets nothing for aging_s ages as before.
        self._served: dict[Hashable, float] = {}
        self.meter = DrfMeter(
            weights,
            default_weight=config.default_weight,
            kv_capacity=config.kv_tokens,
            half_life_s=config.usage_half_life_s,
            lift=config.lift_idle_tenants,
        )

    def group(self, r: SchedRequest) -> Hashable:
        # Everything a waiting request's rank depends on except its wait
        # time and its tenant's score, which are the same across the group
        # (score) or monotone in the heap key (wait_since).
        return (r.tenant, r.cls.band, r.level, r.priority)

    def heap_key(self, r: SchedRequest) -> tuple:
        # While aging, the longest waiter of a group is the most aged (the
        # group's served time lifts every member's start alike).
        return (r.wait_since, r.arrival, r.seq)

    def aging_since(self, r: SchedRequest) -> float:
        """When `r` started aging: its wait start, or its group's last admission if later."""
        served = self._served.get(self.group(r))
        return r.wait_since if served is None or served < r.wait_since else served

    def note_admitted(self, r: SchedRequest, now: float) -> None:
        self._served[self.group(r)] = now

    def settles_at(self, r: SchedRequest) -> float:
        # Fully aged (band, level and priority at the top): from then on the
        # rank within the group is by arrival alone.
        return self.aging_since(r) + (r.cls.band + 1) * self.aging_s

    def partition(self, r: SchedRequest) -> str:
        return r.tenant

    def static_rank(self, r: SchedRequest, now: float) -> tuple:
        band, level, prio = aged(r.cls.band, r.level, r.priority, now - self.aging_since(r), self.aging_s)
        return (band, level, prio, r.arrival, r.seq)

    def compose(self, static: tuple, score: float) -> tuple:
        return (static[0], score, *static[1:])

    rank = Fcfs.rank

    def running_rank(self, r: SchedRequest, scores: Mapping[str, float]) -> tuple:
        # A running request has waited 0 s: it ranks by its class band, so
        # aging buys admission, not immunity from preemption.
        return (r.cls.band, scores[r.tenant], r.level, r.priority, r.arrival, r.seq)

    def may_preempt(self, waiter: SchedRequest, victim: SchedRequest) -> bool:
        band = waiter.cls.band
        if band != victim.cls.band:
            return band < victim.cls.band
        # Time slicing within a band (FastServe): the victim used up the
        # quantum of the level it was admitted at, and the waiter's level is
        # better. Not in the batch band: batch has no latency target, so a
        # swap there only costs throughput.
        return (
            band < RequestClass.BATCH.band
            and victim.level > victim.admit_level
            and waiter.level < victim.level
        )

    def preempts_within(self, band: int, victim: SchedRequest | None = None) -> bool:
        # Time slicing, not in the batch band, and only of a runner that
        # used up the quantum of the level it was admitted at.
        if band >= RequestClass.BATCH.band:
            return False
        return victim is None or victim.level > victim.admit_level

    def next_change(self, r: SchedRequest, now: float) -> float:
        return next_aging_change(r.cls.band, r.level, r.priority, self.aging_since(r), now, self.aging_s)


POLICIES: dict[str, type] = {
    "fcfs": Fcfs,
    "priority": StrictPriority,
    "vtc": Vtc,
    "fsched": FschedPolicy,
}


def make_policy(name: str, config: SchedulerConfig, weights: Mapping[str, float]) -> Policy:
    """The policy called `name` (one of POLICIES)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        known = ", ".join(POLICIES)
        raise ValueError(f"unknown policy {name!r} (known: {known})") from None
    return cls(config, weights)
