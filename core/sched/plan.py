"""What one engine step does (`Plan`) and what it reported back (`Outcome`).

The engine executes a plan in this order: park or drop the KV of
`preempted`, restore the KV of `resumed` from the host pool, then run one
forward over the `prefill` chunks and the `decode` rows. Every decode row
and every prefill chunk with `produces_token` yields one token.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from itertools import repeat

from fsched.core.sched.request import Checkpoint
from fsched.core.types import RequestId


@dataclass(slots=True, frozen=True)
class PrefillChunk:
    request_id: RequestId
    start: int  # first context position of the chunk
    tokens: int
    produces_token: bool  # the chunk completes the prefill


@dataclass(slots=True, frozen=True)
class Preemption:
    request_id: RequestId
    checkpoint: Checkpoint
    kv_tokens: int  # KV tokens parked (PARK) or dropped (RECOMPUTE)


@dataclass(slots=True, frozen=True)
class Plan:
    step: int
    prefill: tuple[PrefillChunk, ...] = ()
    decode: tuple[RequestId, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    resumed: tuple[RequestId, ...] = ()  # restored from the host pool before the step
    admitted: tuple[RequestId, ...] = ()  # joined the running batch this step
    kv_tokens: int = 0  # KV slots committed to the running batch for this step
    swap_tokens: int = 0  # KV tokens copied to or from the host pool
    # How many times this plan may run back to back (decode-only plans)
    # before the scheduler has a decision to make, absent arrivals,
    # completions and cancels. The simulator uses it to skip ahead.
    stable_steps: int = 1

    @property
    def tokens(self) -> int:
        """Tokens the forward processes."""
        return len(self.decode) + sum(c.tokens for c in self.prefill)

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode)

    def producing(self) -> tuple[RequestId, ...]:
        """Requests that yield a token in this step (what a remote runner waits for)."""
        return tuple(c.request_id for c in self.prefill if c.produces_token) + self.decode


@dataclass(slots=True, frozen=True)
class Outcome:
    """What the engine reports after running a plan `steps` times.

    `produced` maps a request to the tokens it yielded (default: one per
    step for every producing row); `finished` are those that stopped (EOS,
    stop string or max_tokens); `elapsed_s` is the wall (or simulated) time
    the steps took.
    """

    elapsed_s: float
    finished: frozenset[RequestId] = frozenset()
    produced: Mapping[RequestId, int] | None = None
    steps: int = 1

    def tokens_of(self, request_id: RequestId) -> int:
        """Tokens a producing row yielded."""
        if self.produced is None:
            return self.steps
        return self.produced.get(request_id, 0)

    def tokens_of_all(self, request_ids: Collection[RequestId]) -> int:
        """Tokens these producing rows yielded together (`tokens_of` of each, summed in one pass)."""
        if self.produced is None:
            return self.steps * len(request_ids)
        return sum(map(self.produced.get, request_ids, repeat(0)))
