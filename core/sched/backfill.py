"""Backfill: admitting behind a blocked head without moving its reservation.

When the best waiting request (the head) does not fit and may not make
room, admission would stop there and leave slots and KV idle until enough
running work leaves. Backfill (EASY backfilling, as batch schedulers do it
for jobs) lets requests further down the order take that room, on one
condition: the head still starts by its reservation. The scheduler asks for
it only behind a head that may not preempt, and `behind_in_share` keeps it
to the head's own tenant and tenants no further over their share.

The head's *reservation* is the step by which it fits at the latest. Every
running request is taken to run to its `max_tokens`, holding its final
context (prompt plus `max_tokens`: the most it can hold) until it leaves: a
decoding request within its remaining tokens (every step decodes it), one
still prefilling once all the prefills running are done at the budget a
full batch of decodes leaves, and then its decode. A request behind the
head may start now when it fits now, its prefill holds back no prefill the
reservation counts on, and it either

* leaves by the reservation at the latest (reckoned the same way), or
* fits beside the head at the reservation: its final context comes out of
  the KV (and its slot out of the slots) the head leaves spare then.

So the head starts by its reservation whatever was backfilled, unless work
ranked ahead of it arrives meanwhile (as without backfill). Requests that
stop early (an end-of-sequence token) only bring that step forward. The
head may start a little later than it would have without backfill (a
backfilled request still holding room the head could have had early), never
later than its reservation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.policy import Standing
from fsched.core.sched.preemption import Room
from fsched.core.sched.request import Request

# Waiting requests looked at behind a blocked head each step: backfill
# matters for the best-ranked few, and the scan stays cheap in long queues.
BACKFILL_SCAN = 32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def final_context(r: Request) -> int:
    """The KV a request holds when it reaches max_tokens: the most it ever holds."""
    return r.prompt_tokens + r.max_tokens


def _leaves_within(remaining: int, prefill_tokens: int, prefills: int, config: SchedulerConfig) -> int:
    """Steps within which a request that still has to prefill leaves, when
    `prefills` running requests have `prefill_tokens` to prefill in all
    (itself included) and no more arrive ahead: every step has at least the
    budget a full batch of decodes leaves; a chunk may stop one token short
    (one more step per prefill); the last chunk yields the first token."""
    budget = config.step_tokens - config.max_batch
    return _ceil_div(prefill_tokens, budget) + prefills + remaining - 1


@dataclass(slots=True)
class Reservation:
    """When the head fits at the latest, and what is left beside it then."""

    step: int  # steps from now
    spare_kv: int
    spare_slots: int
    prefill_tokens: int  # still to prefill in the running batch (and in what was backfilled)
    prefills: int  # ... by how many requests
    leaving_prefill: int | None  # most output tokens of a prefilling request counted as gone by then

    def admits(self, cand: Request, config: SchedulerConfig) -> bool:
        """Whether `cand` (which fits now) may start without moving the reservation;
        if so, what it uses comes out of the spare room or the prefill queue."""
        pending = cand.pending_prefill
        tokens, prefills = self.prefill_tokens + pending, self.prefills + (1 if pending else 0)
        if pending and self.leaving_prefill is not None and \
                _leaves_within(self.leaving_prefill, tokens, prefills, config) > self.step:
            return False  # its prefill would hold back one the reservation counts on
        leaves = _leaves_within(cand.remaining_tokens, tokens, prefills, config) if pending \
            else cand.remaining_tokens
        if leaves > self.step:
            need = final_context(cand) + config.min_quantum_steps
            if self.spare_slots < 1 or self.spare_kv < need:
                return False
            self.spare_kv -= need
            self.spare_slots -= 1
        self.prefill_tokens, self.prefills = tokens, prefills
        return True


def reserve_for(head: Request, running: Iterable[Request], config: SchedulerConfig,
                slots: int) -> Reservation | None:
    """The head's reservation among `running` within `slots` batch slots (None
    when it never fits beside them: they hold too much even at their end)."""
    mq = config.min_quantum_steps
    held = list(running)
    tokens = sum(r.pending_prefill for r in held)
    prefills = sum(1 for r in held if r.pending_prefill)

    def leaves(r: Request) -> int:
        if r.pending_prefill:
            return _leaves_within(r.remaining_tokens, tokens, prefills, config)
        return r.remaining_tokens  # every step decodes every decoding request

    exits = sorted(((leaves(r), r) for r in held), key=lambda e: e[0])
    kv_held = sum(final_context(r) for r in held)
    step, i, leaving_prefill = 0, 0, None
    while True:
        n = len(exits) - i
        spare_kv = config.kv_tokens - kv_held - (n + 1) * mq - head.context
        if spare_kv >= 0 and slots - n - 1 >= 0:
            return Reservation(step, spare_kv, slots - n - 1, tokens, prefills, leaving_prefill)
        if i == len(exits):
            return None
        step = exits[i][0]
        while i < len(exits) and exits[i][0] <= step:
            r = exits[i][1]
            if r.pending_prefill:
                leaving_prefill = max(leaving_prefill or 0, r.remaining_tokens)
            kv_held -= final_context(r)
            i += 1


def behind_in_share(cand: Request, head: Request, stand: Mapping[str, Standing]) -> bool:
    """Whether `cand` may take room the head leaves: it is the head's tenant's,
    or its tenant is no further over its share than the head's."""
    return cand.tenant == head.tenant or stand[cand.tenant].score <= stand[head.tenant].score


def backfills(head: Request, ranked: Iterable[Request], reservation: Reservation,
              stand: Mapping[str, Standing], config: SchedulerConfig, room: Callable[[], Room]
              ) -> Iterator[Request]:
    """The requests of `ranked` (in rank order) that may start now behind `head`;
    `room()` is the batch's free room, read again as each one starts."""
    for cand in ranked:
        if cand is head or not behind_in_share(cand, head, stand):
            continue
        free = room()
        if free.slots < 1:
            return
        if free.kv_tokens >= cand.context and reservation.admits(cand, config):
            yield cand
