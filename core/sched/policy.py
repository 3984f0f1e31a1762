"""Ordering policies behind one small interface, made by name.

A policy says how requests are ordered and which running request a waiter
may displace; never what the batch holds (the mechanism in `scheduler.py`
is the same for all four).

* Waiting requests sit in per-group lines (`group`, `line`: lines.py):
  everything in a group shares every part of the rank but the last, the
  order inside the group (arrival for the baselines; by deadline for
  fsched), so the line's head is the group's best.
* `rank` is the total order (smaller first). It is `compose(static_rank,
  standing)`: the part that depends only on the request, and the standing
  of its tenant (`Standing`: score, within its share, precedence). Within
  a tenant the static part alone orders the requests, so the queue keeps
  one heap of group heads per tenant and class.

fsched's order has two tiers:

1. **Precedence**: realtime and streaming work of tenants whose recent
   realtime and streaming use is within their share; by class, then the
   tenant's score (the one further below its share first), then within the
   tenant by base priority and the order inside its class (lines.py:
   what can still make its target first, aging bounding every wait): a
   base priority orders its own tenant's work only, so a label never puts one tenant ahead of another.
   Only precedence work may preempt: work outside precedence, then
   precedence work of a worse class of its own tenant, or of a tenant whose
   score is above its tenant's. A waiter that can still make its target
   preempts at once (`grace`); the step that yields a realtime first token
   still on target carries no prefill after it (`due`). Running prefills
   take a step's budget in this order, except that one that can still make
   its target goes ahead of one of its class that cannot, of any tenant
   (`running_rank`).
2. **Share**: everything else, by tenant score (weighted dominant use,
   lowest first, as DRF), then within the tenant by class, priority and
   the order inside the class (batch too by deadline: on-time before late,
   aging bounding every wait): a request waits only behind its own
   tenant's work of its class.

A tenant beyond its share competes in the second tier with all its work,
however it labels it: labels order a tenant's work, the weights order the
tenants.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.lines import ON_TIME, ArrivalLine, DeadlineLine, Line, band, deadline_key, on_target
from fsched.core.sched.request import Request
from fsched.core.sched.usage import DrfMeter, NullMeter, TenantMeter, VtcMeter
from fsched.core.types import RequestClass

INF = float("inf")
BATCH_BAND = RequestClass.BATCH.band


@dataclass(slots=True, frozen=True)
class Standing:
    """A tenant's place among the tenants.

    `score`: its weighted dominant use (lower is further below its share);
    `in_share`: its score is within the slack of the lowest score among
    the tenants with work waiting; `precedence`: its realtime and streaming
    work recently used at most its entitled share of the machine (with the
    slack), so that work may go first.
    """

    score: float = 0.0
    in_share: bool = True
    precedence: bool = True


def standings(scores: Mapping[str, float], backlogged: Iterable[str], slack: float,
              precedence_use: Mapping[str, float] | None = None,
              entitled: Mapping[str, float] | None = None) -> dict[str, Standing]:
    """Each scored tenant's standing (see `Standing`); `precedence_use` and
    `entitled` are fractions of the machine (a tenant missing from either has
    precedence)."""
    waiting = [scores[t] for t in backlogged if t in scores]
    ceiling = min(waiting) * (1.0 + slack) if waiting else INF
    use, share = precedence_use or {}, entitled or {}
    return {
        t: Standing(s, s <= ceiling, use.get(t, 0.0) <= share.get(t, 1.0) * (1.0 + slack))
        for t, s in scores.items()
    }


class Policy(Protocol):
    name: str
    preemptive: bool
    meter: TenantMeter

    def group(self, r: Request) -> Hashable: ...
    def line(self, r: Request) -> Line: ...
    def partition(self, r: Request) -> str: ...
    def static_rank(self, r: Request, now: float) -> tuple: ...
    # The rank of a static rank under its tenant's standing. Under one standing, statics keep one order
    # whatever that standing is (the scheduler relies on it while one tenant's work alone waits).
    def compose(self, static: tuple, standing: Standing) -> tuple: ...
    def rank(self, r: Request, now: float, stand: Mapping[str, Standing]) -> tuple: ...
    def running_rank(self, r: Request, stand: Mapping[str, Standing], now: float) -> tuple: ...
    def may_preempt(self, waiter: Request, now: float, stand: Mapping[str, Standing]) -> bool: ...
    def grace(self, waiter: Request, now: float) -> int: ...
    def due(self, r: Request, now: float) -> bool: ...
    def victim_order(self, waiter: Request, victim: Request,
                     stand: Mapping[str, Standing]) -> tuple | None: ...
    def victim_keys(self, waiter: Request, rows: Iterable[Request],
                    stand: Mapping[str, Standing]) -> tuple[list[tuple], list[Request]]: ...
    # Policies whose `victim_keys` put some rows first whatever the waiter (`outside_victims`): a row is
    # there when `outside_key` says it always is, or its tenant's `outside_rank` says its other rows are
    # too, with the key (1, that rank's part, *the row's tail: numbers that do not move within a scheduling
    # pass). preemption.OutsideOrder keeps them in that order through a pass.
    outside_victims: bool
    def outside_key(self, r: Request) -> tuple[bool, tuple]: ...
    def outside_rank(self, standing: Standing) -> tuple[float, bool]: ...


class Fcfs:
    """Arrival order, no preemption, no tenants."""

    name = "fcfs"
    preemptive = False
    outside_victims = False  # no rows its victim keys put first whatever the waiter (see Policy)
    grace_steps = 0  # preemptive policies: steps a waiter waits for a slot instead of preempting
    backfills = False  # admits behind a blocked head (backfill.py); the baselines stop at it, as engines do

    def __init__(self, config: SchedulerConfig, weights: Mapping[str, float]) -> None:
        self.meter: TenantMeter = NullMeter(weights, config.default_weight)
        self.config = config

    def group(self, r: Request) -> Hashable:
        return ()

    def line(self, r: Request) -> Line:
        """The order inside `r`'s group (lines.py): by arrival."""
        return ArrivalLine()

    def partition(self, r: Request) -> str:
        return ""  # no tenants: one partition

    def static_rank(self, r: Request, now: float) -> tuple:
        return (r.arrival, r.seq)

    def compose(self, static: tuple, standing: Standing) -> tuple:
        return static

    def rank(self, r: Request, now: float, stand: Mapping[str, Standing]) -> tuple:
        """The total order of waiting requests (smaller first)."""
        return self.compose(self.static_rank(r, now), stand.get(self.partition(r), Standing()))

    def running_rank(self, r: Request, stand: Mapping[str, Standing], now: float) -> tuple:
        return (r.arrival, r.seq)

    def may_preempt(self, waiter: Request, now: float, stand: Mapping[str, Standing]) -> bool:
        """Whether `waiter` may displace running work at all."""
        return False

    def grace(self, waiter: Request, now: float) -> int:
        """Steps `waiter` waits for a running request to leave before it preempts one."""
        return self.grace_steps

    def due(self, r: Request, now: float) -> bool:
        """Whether the step starting at `now` that completes `r`'s prefill carries no more prefill
        after it (planning.py)."""
        return False

    def victim_order(self, waiter: Request, victim: Request,
                     stand: Mapping[str, Standing]) -> tuple | None:
        """None when `waiter` may not displace `victim`; else a key, largest preempted first
        (`victim_keys` of one row)."""
        keys, _ = self.victim_keys(waiter, (victim,), stand)
        return keys[0] if keys else None

    def victim_keys(self, waiter: Request, rows: Iterable[Request],
                    stand: Mapping[str, Standing]) -> tuple[list[tuple], list[Request]]:
        """The `victim_order` keys of the rows of `rows` that `waiter` may displace, and those rows
        (two lists, in `rows`' order): a whole running set at once, what depends on the waiter
        alone read once (a burst of waiters under a full batch asks this of every running row for
        each waiter)."""
        return [], []


class StrictPriority(Fcfs):
    """Class band, then base priority, then arrival; preempts strictly worse
    running work, latest arrival first (vLLM's priority policy). No tenants."""

    name = "priority"
    preemptive = True

    def group(self, r: Request) -> Hashable:
        return (r.request_class.band, r.priority)

    def static_rank(self, r: Request, now: float) -> tuple:
        return (r.request_class.band, r.priority, r.arrival, r.seq)

    def running_rank(self, r: Request, stand: Mapping[str, Standing], now: float) -> tuple:
        return (r.request_class.band, r.priority, r.arrival, r.seq)

    def may_preempt(self, waiter: Request, now: float, stand: Mapping[str, Standing]) -> bool:
        return True

    def victim_keys(self, waiter: Request, rows: Iterable[Request],
                    stand: Mapping[str, Standing]) -> tuple[list[tuple], list[Request]]:
        own = (waiter.request_class.band, waiter.priority)
        keys, victims = [], []
        for victim in rows:
            victim_band = victim.request_class.band
            if own < (victim_band, victim.priority):  # strictly worse running work only
                keys.append((victim_band, victim.priority, victim.arrival, victim.seq))
                victims.append(victim)
        return keys, victims


class Vtc(Fcfs):
    """Virtual Token Counter: the backlogged tenant with the lowest weighted
    counter goes next, its oldest request first; no preemption."""

    name = "vtc"

    def __init__(self, config: SchedulerConfig, weights: Mapping[str, float]) -> None:
        super().__init__(config, weights)
        self.meter = VtcMeter(weights, default_weight=config.default_weight, lift=config.lift_idle_tenants)

    def group(self, r: Request) -> Hashable:
        return r.tenant

    def partition(self, r: Request) -> str:
        return r.tenant

    def compose(self, static: tuple, standing: Standing) -> tuple:
        return (standing.score, *static)

    def running_rank(self, r: Request, stand: Mapping[str, Standing], now: float) -> tuple:
        return (stand[r.tenant].score, r.arrival, r.seq)


class FschedPolicy(Fcfs):
    """Precedence for in-share realtime and streaming work, weighted DRF for the rest."""

    name = "fsched"
    preemptive = True
    outside_victims = True

    def __init__(self, config: SchedulerConfig, weights: Mapping[str, float]) -> None:
        super().__init__(config, weights)
        self.grace_steps = config.preempt_grace_steps
        self.backfills = config.backfill
        self.meter = DrfMeter(
            weights,
            default_weight=config.default_weight,
            kv_capacity=config.kv_tokens,
            half_life_s=config.usage_half_life_s,
            lift=config.lift_idle_tenants,
        )

    def group(self, r: Request) -> Hashable:
        return (r.tenant, r.request_class.band, r.priority)

    def line(self, r: Request) -> Line:
        """Every class by deadline (lines.py: what can still make its target first, late work
        behind, aging bounding every wait). Realtime and streaming: the shortest prefill first
        among the on-time; batch, whose minute a prefill hardly dents: on-time by arrival."""
        return DeadlineLine(self.config, shortest_first=r.request_class.band < BATCH_BAND)

    def partition(self, r: Request) -> str:
        return r.tenant

    def _inner(self, r: Request, now: float) -> tuple:
        """The order inside the group (always the rank's last part: it moves with time)."""
        return deadline_key(r, now, self.config, shortest_first=r.request_class.band < BATCH_BAND)

    def static_rank(self, r: Request, now: float) -> tuple:
        return (r.request_class.band, r.tenant, r.priority, *self._inner(r, now))

    def compose(self, static: tuple, standing: Standing) -> tuple:
        band, tenant, *own = static
        if band < BATCH_BAND and standing.precedence:
            # precedence tier: class, then the tenant further below its share; a base priority orders
            # only its own tenant's work, so no label moves a tenant ahead of another
            return (0, band, standing.score, tenant, *own)
        return (1, standing.score, tenant, band, *own)  # share tier: DRF across tenants

    def running_rank(self, r: Request, stand: Mapping[str, Standing], now: float) -> tuple:
        # As `rank` (a running request's prefill chunks go in this order: planning.py), except that
        # in the precedence tier a prefill that can still make its target goes ahead of one of its
        # class that cannot, whatever their tenants: the first was admitted to make its target, the
        # second has missed it and loses nothing the class is measured by when it waits a step
        # (without this, a long realtime prompt of the tenant further below its share held a short
        # one of the other tenant for seconds; both tenants are within their share).
        # In the share tier the tenants' scores chose who was admitted; among the admitted, prefill
        # goes by arrival, so a prompt admitted early is not held (its KV idle) behind prompts of a
        # tenant with a lower score admitted after it.
        rank = self.compose(self.static_rank(r, now), stand[r.tenant])
        if rank[0] == 0:
            return (0, rank[1], not on_target(r, now), *rank[2:])
        return (1, r.arrival, r.seq)

    def may_preempt(self, waiter: Request, now: float, stand: Mapping[str, Standing]) -> bool:
        # Only realtime and streaming work with precedence displaces others:
        # batch has no latency to protect, so it takes the next free slot.
        return waiter.request_class.band < BATCH_BAND and stand[waiter.tenant].precedence

    def grace(self, waiter: Request, now: float) -> int:
        # A waiter that can still make its target takes its room now: waiting for a slot would
        # spend the target's slack (late_at is a mean step's estimate, so a wait that fits the slack
        # on paper often does not). The grace spares a checkpoint where waiting costs nothing the
        # class is measured by: the target is already out of reach, or the first token is out.
        return 0 if band(waiter, now) == ON_TIME else self.grace_steps

    def due(self, r: Request, now: float) -> bool:
        # The step that yields a realtime first token still on target carries no further prefill:
        # a step's time grows with its tokens, so the token comes as early as its own work allows;
        # the prefill left out goes in the next step. Realtime only: its target is a few full steps
        # (0.5 s against ~0.13 s), so the length of that one step decides it; streaming's 2 s spans
        # a dozen, and holding those steps short too delayed batch prefill for little.
        return r.request_class is RequestClass.REALTIME and r.generated == 0 and now < r.deadline

    def victim_keys(self, waiter: Request, rows: Iterable[Request],
                    stand: Mapping[str, Standing]) -> tuple[list[tuple], list[Request]]:
        # Victims: work outside the precedence tier (batch, and any work of a
        # tenant beyond its share). The tenant furthest over its share first,
        # then the cheapest to checkpoint (least KV), then the youngest. Then
        # precedence work of a worse class, the last in the tier's order first:
        # the waiter's own tenant's (also a worse base priority), or another
        # tenant's when that tenant's score is above the waiter's tenant's. A
        # label never displaces the work of a tenant that is not ahead of it.
        # The waiter enters only through its tenant, band and priority, each read once. A row's
        # band is spelled out: a property call a row was much of this loop's cost. Its key outside the
        # tier is `outside_key`'s, the one preemption.OutsideOrder keeps through a pass.
        waiter_tenant, waiter_priority = waiter.tenant, waiter.priority
        waiter_band = waiter.request_class.band
        keys, victims = [], []
        for victim in rows:
            standing = stand[victim.tenant]
            if victim.request_class is not RequestClass.BATCH and standing.precedence:
                victim_band = victim.request_class.band
                if victim.tenant == waiter_tenant:
                    behind = (waiter_band, waiter_priority) < (victim_band, victim.priority)
                else:  # a worse class of a tenant further over its share
                    behind = waiter_band < victim_band and standing.score > stand[waiter_tenant].score
                if behind:
                    keys.append((0, victim_band, victim.priority, victim.arrival, victim.seq))
                    victims.append(victim)
                continue
            keys.append((1, standing.score, *self.outside_key(victim)[1]))
            victims.append(victim)
        return keys, victims

    @staticmethod
    def outside_key(r: Request) -> tuple[bool, tuple]:
        """Whether `r` is outside the precedence tier whatever its tenant's standing (batch work), and
        its key's tail there (`victim_keys`: the cheapest to checkpoint, then the youngest)."""
        return (r.request_class is RequestClass.BATCH,
                (-r.computed / (r.prompt_tokens + r.generated), r.arrival, r.seq))

    @staticmethod
    def outside_rank(standing: Standing) -> tuple[float, bool]:
        """A tenant's part of its outside rows' keys (the furthest over its share first), and whether
        its realtime and streaming rows are outside too (it lacks precedence)."""
        return standing.score, not standing.precedence


POLICIES: dict[str, type] = {
    "fcfs": Fcfs,
    "priority": StrictPriority,
    "vtc": Vtc,
    "fsched": FschedPolicy,
}


def make_policy(name: str, config: SchedulerConfig, weights: Mapping[str, float]) -> Policy:
    """The policy called `name` (one of POLICIES)."""
    try:
        policy_type = POLICIES[name]
    except KeyError:
        known = ", ".join(POLICIES)
        raise ValueError(f"unknown policy {name!r} (known: {known})") from None
    return policy_type(config, weights)
