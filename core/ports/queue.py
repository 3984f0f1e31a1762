"""QueueStore: what a daemon needs from the job table.

A daemon claims queued requests under a lease, writes their tokens back as
they come, ends them, and hands back what it cannot finish. Several daemons
may share one queue; leases and epochs keep each request in one daemon's
hands at a time.

What every implementation must hold:

1. **Atomic claims.** A queued request is claimed by at most one caller;
   two concurrent claims never return the same request.
2. **Leases with epochs.** A claim moves a request to `running`, leased to
   its owner until `lease_s` from now, and raises its lease epoch by one
   (the fencing token). Renewal extends a lease only for its owner, under
   the epoch the owner names.
3. **Fencing.** A write (tokens, completion) that names an owner is applied
   only while that owner holds the request under the epoch the write names.
   Anything else is refused and changes nothing: a daemon that lost a
   request (reclaimed, requeued, cancelled) cannot overwrite its successor.
4. **Nothing ends twice.** A finished request never changes again.
5. **Resume, never restart.** A request handed back (released, reclaimed,
   failed step) keeps its flushed tokens, and its next claim returns them.
6. **Cancels end work.** A request of a cancelled job is never claimed;
   one handed back after its job was cancelled ends `cancelled`.
7. **Short transactions.** Each call is one transaction; none is held
   across calls, so a daemon never holds the table during a model step.
   `write_step` puts a step's writes (tokens, completions, a claim) in one:
   they commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from fsched.core.ports.records import (
    Completion,
    DaemonSummary,
    PeerUsage,
    TokenUpdate,
)
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId


@dataclass(slots=True, frozen=True)
class ClaimAsk:
    """A claim to make along with a step's writes: `QueueStore.claim`'s arguments but its owner."""

    per_group: int
    held: Mapping[tuple[str, RequestClass], int] = field(default_factory=dict)
    limit: int | None = None
    lease_s: float = 30.0


@dataclass(slots=True, frozen=True)
class StepWritten:
    """What `write_step` did: `flush_tokens`', `finish_requests`' and `claim`'s answers."""

    written: int = 0
    finished: list[bool] = field(default_factory=list)
    claimed: list[Request] = field(default_factory=list)


@runtime_checkable
class QueueStore(Protocol):
    def claim(
        self,
        owner: str,
        per_group: int,
        held: Mapping[tuple[str, RequestClass], int] | None = None,
        limit: int | None = None,
        lease_s: float = 30.0,
        announced: bool = False,
    ) -> list[Request]:
        """Lease queued requests to `owner`, fairly, and return their live records (core/sched/request.py):
        each with its prompt as stored (not yet encoded) and its tokens so far. `announced`: the caller
        was told of new work (the store may skip a cheap look for any before it takes its write lock).

        Up to `per_group` for each (tenant, class) group, less what `held`
        says the owner already holds of it, and at most `limit` in all. A
        group's jobs go by base priority then age, each job's requests in
        input order, so one tenant's large file never hides another's work.
        Each returned request carries its new lease epoch and attempt count.
        """
        ...

    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int:
        """Persist running requests' output so far; return how many were written.

        An update is written only if `owner` still holds the request, under
        the update's epoch when it names one; the others are skipped, silently
        (the caller counts them as fenced).
        """
        ...

    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]:
        """End requests with their final output; one answer per completion, in order.

        False, changing nothing, when the request had already ended or, given
        an `owner`, when that owner no longer holds it under the completion's
        epoch. Raises ValueError for a state that is not final and StoreError
        for an unknown request.
        """
        ...

    def write_step(self, owner: str, updates: Sequence[TokenUpdate], completions: Sequence[Completion],
                   claim: ClaimAsk | None = None) -> StepWritten:
        """`flush_tokens(owner, updates)`, `finish_requests(completions, owner)` and, given `claim`, a claim
        for `owner`, in ONE transaction: all of it is written or (it raises) none of it. A daemon's step
        writes back this way: a transaction's own cost (its lock, its commit, its round trips) paid once,
        not once for each.
        """
        ...

    def release(self, owner: str | None = None, request_ids: Sequence[RequestId] | None = None) -> int:
        """Hand running requests back to the queue with their flushed tokens; return how many.

        `owner` None releases every running request, whoever holds it: only
        a daemon that is alone on the table may do that, at its start.
        Requests of a cancelled job end `cancelled` instead.
        """
        ...

    def renew_leases(self, owner: str, leases: Mapping[RequestId, int], lease_s: float) -> set[RequestId]:
        """Extend `owner`'s leases (request -> lease epoch) by `lease_s` from now; return those still held.

        A request missing from the answer is lost to this owner: it must be
        dropped without writing anything more for it.
        """
        ...

    def reclaim_expired(self) -> int:
        """Requeue (or, for a cancelled job, cancel) running requests whose lease expired."""
        ...

    def exchange_usage(self, owner: str, usage: Mapping[str, tuple[float, float]]) -> list[PeerUsage]:
        """Publish `owner`'s decayed usage per tenant (GPU s, KV token-s); return the other daemons'.

        `owner`'s new figures replace its old ones; it never sees its own.
        """
        ...

    def cancelled_held(self, owner: str) -> list[RequestId]:
        """Requests `owner` holds whose job a user cancelled: to stop at the next step."""
        ...

    def tenant_weights(self) -> dict[str, float]:
        """Every tenant's weight, as last set."""
        ...

    def may_have_changed(self) -> bool:
        """False only when the table certainly did not change since the last call (a cheap check an
        idle daemon makes before it looks for work); True when it cannot tell."""
        ...

    def has_queued(self, running_too: bool = False) -> bool:
        """Whether any request waits to be claimed (with `running_too`: or is held by a daemon)."""
        ...

    def heartbeat(self, daemon: DaemonSummary) -> None:
        """Insert or refresh a daemon's row; a summary with `stopped_at` set is its goodbye."""
        ...

    def prepare(self, largest: int) -> None:
        """Make ready, before the first step, what the steps run for up to `largest` requests at a time
        (a store whose statements are compiled compiles them now, so that no step pays for it)."""
        ...

    def keep_statistics(self) -> None:
        """From now on while the process runs, keep fresh whatever statistics the store's database plans
        the steps' statements from (PostgreSQL's of a table that grows fast: storage/statistics.py), on a
        thread of its own."""
        ...
