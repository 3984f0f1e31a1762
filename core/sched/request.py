"""The scheduler's view of one request: lengths, progress, timers.

Token bookkeeping: `context` is prompt plus generated tokens; `computed` is
how many of them have KV on the device. A decoding request has
`computed == context - 1` (its last token is fed in the next step). A
request whose KV was dropped (recompute) prefills its whole context again,
and the chunk that completes the prefill produces the next token, so the
output is the same as an uninterrupted run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fsched.core.types import RequestClass, RequestId, RequestState


class Checkpoint(enum.StrEnum):
    """What happens to a preempted request's KV cache."""

    PARK = "park"  # copied to the host pool, restored on resume
    RECOMPUTE = "recompute"  # dropped; prompt + generated tokens prefilled again


@dataclass(slots=True, eq=False)
class SchedRequest:
    id: RequestId
    tenant: str
    request_class: RequestClass
    prompt_tokens: int
    max_tokens: int
    arrival: float
    priority: int = 5  # base priority: 0 most urgent .. 9 least (the priority baseline orders by it)

    # Mutable progress, owned by the scheduler.
    state: RequestState = RequestState.QUEUED
    generated: int = 0
    computed: int = 0
    parked: bool = False
    wait_since: float = 0.0  # when it last started waiting (arrival or preemption)
    run_steps: int = 0  # steps with progress since last admission (minimum quantum)
    idle_steps: int = 0  # consecutive running steps without a prefill chunk
    preemptions: int = 0
    res_gpu: float = 0.0  # usage granted by the tenant meter and not yet used:
    res_kv: float = 0.0  # GPU seconds and KV token-seconds
    seq: int = 0  # admission-order tie-breaker, unique per scheduler
    # First-token timing, set when it starts waiting (lines.stamp): its class's target after its
    # arrival, when that target goes out of reach, when it has waited its aging limit.
    deadline: float = float("inf")
    late_at: float = float("inf")
    aged_at: float = float("inf")

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be >= 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 <= self.priority <= 9:
            raise ValueError("priority must be within 0..9")

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def pending_prefill(self) -> int:
        """Tokens to prefill before the request can decode (0 when decoding)."""
        if self.generated > 0 and self.computed == self.context - 1:
            return 0
        return self.context - self.computed

    @property
    def remaining_tokens(self) -> int:
        """Output tokens left before `max_tokens` stops the request."""
        return self.max_tokens - self.generated
