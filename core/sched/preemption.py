"""Whether to preempt, whom, and how: pure functions of the running set.

A preemption pays or is not taken:
* a waiter that may preempt (the policy says which) waits instead when a
  running request reaches its max_tokens within the policy's grace steps
  and its leaving makes room;
* victims are the policy's choice among running requests under the
  preemption bound and, when re-admitted after a preemption, past their
  minimum quantum, in the policy's order, and no more of them than the
  room needs (one spared when later, larger victims make its room anyway);
* each victim's KV is parked in the host pool when there is room (a copy
  out and back, about a tenth of recomputing it on the modelled GPU), else
  dropped and recomputed, but only when it holds at most
  `max_recompute_tokens`: a long context is never re-prefilled to save a
  short wait. A victim that can be neither is not a victim.

`OutsideOrder` is the one piece with state: one pass's order of the victims
every waiter of that pass takes first (fsched's rows outside its precedence
tier), so that a burst of waiters does not read every running row each.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.policy import Policy, Standing
from fsched.core.sched.request import Checkpoint, Request
from fsched.core.types import RequestId

LAZY_PICKS = 8  # victims found by a `max` each before the rest are sorted (largest_first)


@dataclass(slots=True, frozen=True)
class Room:
    """What the running batch has free: slots and KV token slots (after the reserve)."""

    slots: int
    kv_tokens: int
    host_tokens: int  # free host pool for parked KV


def checkpoint_for(victim: Request, host_free: int, config: SchedulerConfig) -> Checkpoint | None:
    """Park when the host pool has room, recompute a short context, else None (not a victim)."""
    kv = victim.computed
    if kv == 0 or kv <= host_free:
        return Checkpoint.PARK if kv else Checkpoint.RECOMPUTE
    return Checkpoint.RECOMPUTE if kv <= config.max_recompute_tokens else None


def slot_frees_soon(running: Iterable[Request], steps: int, need_kv: int, free_kv: int) -> bool:
    """Whether a decoding request reaches max_tokens within `steps` steps and,
    with what finishing frees, `need_kv` more KV slots fit."""
    if steps <= 0:
        return False
    leaving = [r for r in running if r.pending_prefill == 0 and r.remaining_tokens <= steps]
    return bool(leaving) and free_kv + sum(r.context for r in leaving) >= need_kv


def preemptible(r: Request, config: SchedulerConfig) -> bool:
    """Under the preemption bound, and, when it was preempted before, past its
    minimum quantum since it came back (a first preemption costs only the
    checkpoint; a second one right after re-admission would thrash)."""
    return bool(preemptible_rows((r,), config))


def preemptible_rows(running: Iterable[Request], config: SchedulerConfig) -> list[Request]:
    """The rows of `running` that are `preemptible`, in order (the bounds read once)."""
    bound, quantum = config.max_preemptions, config.min_quantum_steps
    return [r for r in running
            if r.preemptions < bound and (r.preemptions == 0 or r.run_steps >= quantum)]


def largest_first(keys: list[tuple], rows: list[Request], picks: int = LAZY_PICKS) -> Iterator[Request]:
    """`rows` in the order of a stable sort by their `keys` (a list in parallel), largest first (as
    `sorted(..., reverse=True)`), found lazily: the first `picks` by a `max` each (the first of
    equal keys first, as the stable sort puts it), the rest by one sort. A waiter mostly needs a
    victim or two of a full batch's rows; sorting every row's key cost more than that. Consumes
    both lists (they are the caller's to give up)."""
    for _ in range(min(picks, len(keys))):
        i = keys.index(max(keys))
        del keys[i]
        yield rows.pop(i)
    rest = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    yield from (rows[i] for i in rest)


class OutsideOrder:
    """The running rows a policy with `outside_victims` puts first as victims whatever the waiter, in its
    `victim_keys` order, kept through one scheduling pass. Each tenant's rows are sorted once (their
    tails do not move within a pass), and a waiter's order is their merge under the standings of its
    turn, read lazily: a burst of realtime waiters under a full batch costs each its tenants and its
    victims, not a key for every running row (each waiter's standings may differ, so it is no cache
    of keys). Rows admitted during the pass join as `admitted` (the pass's list of their ids) grows;
    rows that left the running set are passed over. Equal keys keep the running set's order, as the
    stable sort behind `largest_first` does."""

    def __init__(self, policy: Policy, running: Mapping[RequestId, Request], admitted: list[RequestId],
                 config: SchedulerConfig) -> None:
        self._policy, self._running, self._admitted, self._config = policy, running, admitted, config
        self._seen = len(admitted)  # those admitted before are in `running` already
        self._tenants: dict[str, tuple[list, list]] = {}  # its rows outside always, and the others
        self._joined = 0
        for r in preemptible_rows(running.values(), config):
            rows, entry = self._place(r)
            rows.append(entry)
        for lists in self._tenants.values():
            for rows in lists:
                rows.sort()

    def _place(self, r: Request) -> tuple[list[tuple], tuple]:
        """`r`'s tenant's list for it, and its entry there (sorted: largest key first, then running
        order)."""
        always, tail = self._policy.outside_key(r)
        self._joined += 1
        return (self._tenants.setdefault(r.tenant, ([], []))[0 if always else 1],
                (tuple(-x for x in tail), self._joined, r))

    def ordered(self, stand: Mapping[str, Standing]) -> Iterator[Request]:
        """The rows outside under `stand`, largest key first."""
        for request_id in self._admitted[self._seen:]:
            r = self._running.get(request_id)  # None: preempted since
            if r is not None and preemptible(r, self._config):
                insort(*self._place(r))
        self._seen = len(self._admitted)
        parts = []
        for tenant, (always, others) in self._tenants.items():
            rank, others_too = self._policy.outside_rank(stand[tenant])
            parts += [_ranked(-rank, rows) for rows in (always, others if others_too else ()) if rows]
        running = self._running
        for _, (_, _, r) in heapq.merge(*parts):
            if running.get(r.id) is r:
                yield r


def _ranked(rank: float, rows: list[tuple]) -> Iterator[tuple]:
    """A tenant's sorted rows, each behind its tenant's part of the key (for `heapq.merge`)."""
    return ((rank, entry) for entry in rows)


def choose_victims(
    waiter: Request,
    running: Iterable[Request],
    room: Room,
    need_kv: int,
    policy: Policy,
    stand: Mapping[str, Standing],
    config: SchedulerConfig,
    outside: OutsideOrder | None = None,
) -> list[tuple[Request, Checkpoint]] | None:
    """Victims that make room for `waiter` (one slot and `need_kv` KV slots), in
    the policy's order, or None when no such set exists.

    Taken in the policy's order until the room suffices; then every victim that
    the later (larger) ones made unnecessary is spared, so no request is
    preempted for room that is not needed. With the pass's `outside` order, its
    rows are tried first: they lead the policy's order, so a room they make is
    the room the whole order makes; only when they cannot is every row's key read."""
    if outside is not None and (chosen := take_for_room(outside.ordered(stand), room, need_kv, config)):
        return chosen
    ordered = largest_first(*policy.victim_keys(waiter, preemptible_rows(running, config), stand))
    return take_for_room(ordered, room, need_kv, config)


def take_for_room(ordered: Iterable[Request], room: Room, need_kv: int, config: SchedulerConfig
                  ) -> list[tuple[Request, Checkpoint]] | None:
    """Victims taken from `ordered` until `room` holds one slot and `need_kv` KV slots, those the later
    ones made unnecessary spared, each with its checkpoint; None when `ordered` cannot make the room."""
    slots, kv, host = room.slots, room.kv_tokens, room.host_tokens
    chosen: list[Request] = []
    for r in ordered:
        if slots >= 1 and kv >= need_kv:
            break
        checkpoint = checkpoint_for(r, host, config)
        if checkpoint is None:
            continue
        if checkpoint is Checkpoint.PARK:
            host -= r.computed
        chosen.append(r)
        # A freed slot also frees that request's share of the decode reserve.
        slots, kv = slots + 1, kv + r.context + config.min_quantum_steps
    if not (slots >= 1 and kv >= need_kv):
        return None
    for r in reversed(chosen[:-1]):  # the last one taken was needed
        freed = r.context + config.min_quantum_steps
        if slots >= 2 and kv - freed >= need_kv:
            chosen.remove(r)
            slots, kv = slots - 1, kv - freed
    return _checkpoints(chosen, room.host_tokens, config)


def _checkpoints(victims: list[Request], host: int, config: SchedulerConfig
                 ) -> list[tuple[Request, Checkpoint]]:
    """Each victim's checkpoint, the host pool filled in victim order (sparing
    victims only leaves more room, so each still has one)."""
    out = []
    for r in victims:
        checkpoint = checkpoint_for(r, host, config) or Checkpoint.RECOMPUTE
        if checkpoint is Checkpoint.PARK:
            host -= r.computed
        out.append((r, checkpoint))
    return out


def memory_victim(running: Iterable[Request], policy: Policy, stand: Mapping[str, Standing],
                  min_quantum: int, now: float) -> Request | None:
    """The last-ranked running request past its minimum quantum (any, when none is):
    whom decode growth past the KV budget evicts."""
    worst = worst_any = None
    for r in running:
        rank = policy.running_rank(r, stand, now)
        if worst_any is None or rank > worst_any[0]:
            worst_any = (rank, r)
        if r.run_steps >= min_quantum and (worst is None or rank > worst[0]):
            worst = (rank, r)
    pick = worst or worst_any
    return None if pick is None else pick[1]
