"""What a step did to each running request and what each tenant is charged.

Each step's time is apportioned by the tokens each request processed
(compute), and each request's KV is charged as tokens held x time (at the
midpoint of a repeated decode run, where it grew linearly). Usage that the
meter reserved for a request when it was admitted is released as it is
used, so a tenant's score counts the work it was given exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fsched.core.sched.plan import Outcome, Plan
from fsched.core.sched.request import Request
from fsched.core.sched.usage import TenantCharge
from fsched.core.types import RequestClass, RequestId


@dataclass(slots=True)
class TenantStep:
    """One tenant's totals over a step: charged, and taken from its reservations."""

    charge: TenantCharge = field(default_factory=TenantCharge)
    reserved_gpu_s: float = 0.0
    reserved_kv_token_s: float = 0.0
    generated: int = 0  # output tokens its requests yielded (their contexts grew by as much)
    precedence: TenantCharge = field(default_factory=TenantCharge)  # its realtime and streaming part


@dataclass(slots=True)
class WorkTally:
    """Tokens the engine processed, and what preemption cost of them.

    `recomputed`: KV tokens dropped by a preemption (prefilled again on
    resume); `parked`: KV tokens copied to the host pool by one (copied back
    on resume). Preemption's cost is both over the tokens computed.
    """

    computed: int = 0
    recomputed: int = 0
    parked: int = 0

    @property
    def preemption_cost(self) -> float:
        """Tokens recomputed or parked as a share of tokens computed (0 before any)."""
        return (self.recomputed + self.parked) / self.computed if self.computed else 0.0


class PrefillStepTimer:
    """The measured seconds of an engine step with prefill: a moving mean over about the last
    `STEPS` such steps (the first one alone at first; 0 before any)."""

    # Enough that one odd step moves it little, few enough that it follows a change of load within
    # a second or two of engine time.
    STEPS = 16
    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def observe(self, plan: Plan, outcome: Outcome) -> None:
        """Fold in a step that ran (a plan without prefill leaves it as it was)."""
        if not plan.prefill:
            return
        if self.seconds == 0.0:
            self.seconds = outcome.elapsed_s
        else:
            self.seconds += (outcome.elapsed_s - self.seconds) / self.STEPS


def expected_decode(r: Request) -> int:
    """Decode tokens an admitted request is reserved for: what max_tokens leaves.

    The most it may run: a tenant's score then counts the whole of the work
    it was given from the moment it was given, and what it does not use is
    released when the request leaves. (Reserving only the mean output seen
    so far would let long decodes, admitted while they look cheap, hold the
    batch: docs/scheduling.md, the reservation.)"""
    return r.remaining_tokens


def apply_step(running: Iterable[Request], plan: Plan, outcome: Outcome) -> dict[str, TenantStep]:
    """Advance every running request by what the step did (`computed`, `generated`, the step counters,
    the unused reservation); per-tenant totals. One pass over the running rows, the common ones (decoding)
    inline, a tenant's totals looked up when the tenant changes from the row before; the sums in the order
    of a row at a time, so the charges are the same to the last bit."""
    steps, elapsed = outcome.steps, outcome.elapsed_s
    decoded, per_token = _decoded(plan, outcome)
    chunks = {c.request_id: c for c in plan.prefill}
    half, batch = (steps - 1) / 2, RequestClass.BATCH
    totals: dict[str, TenantStep] = {}
    tenant, t, charge, precedence = None, None, None, None  # set by the first row
    for r in running:
        if r.tenant != tenant:
            tenant = r.tenant
            t = totals.get(tenant) or totals.setdefault(tenant, TenantStep())
            charge, precedence = t.charge, t.precedence
        n = decoded.get(r.id)
        if n == 0:  # a decode row with nothing reported (most, over streams of chunks): its KV alone
            r.idle_steps += steps
            kv = (r.computed - half) * elapsed
            charge.kv_token_s += kv
            if r.request_class is not batch:
                precedence.kv_token_s += kv
            res_kv = r.res_kv
            if res_kv or r.res_gpu:  # the general path's condition (its GPU part uses nothing: 0 s)
                used_kv = res_kv if res_kv < kv else kv
                r.res_kv = res_kv - used_kv
                t.reserved_kv_token_s += used_kv
            continue
        if n is not None:
            r.computed += n
            r.generated += n
            charge.decode_tokens += n
            t.generated += n
            gpu, held = n, r.computed - half
        else:
            before = r.generated
            gpu, held = _advance_other(r, chunks.get(r.id), outcome, charge)
            t.generated += r.generated - before
        if gpu:
            r.run_steps += steps
            r.idle_steps = 0
        else:
            r.idle_steps += steps
        gpu *= per_token
        kv = held * elapsed
        charge.gpu_s += gpu
        charge.kv_token_s += kv
        if r.request_class is not batch:
            precedence.gpu_s += gpu
            precedence.kv_token_s += kv
        res_gpu, res_kv = r.res_gpu, r.res_kv
        if res_gpu or res_kv:  # min(gpu, res_gpu), min(kv, res_kv), without two calls a row
            used_gpu = res_gpu if res_gpu < gpu else gpu
            used_kv = res_kv if res_kv < kv else kv
            r.res_gpu = res_gpu - used_gpu
            r.res_kv = res_kv - used_kv
            t.reserved_gpu_s += used_gpu
            t.reserved_kv_token_s += used_kv
    return totals


def _decoded(plan: Plan, outcome: Outcome) -> tuple[dict[RequestId, int], float]:
    """The tokens each decode row yielded (one a step, or what the runner reports: a remote engine may
    have run several tokens ahead between two steps; looked up once a row, not asked of the outcome
    twice), and the step's seconds a token processed."""
    decoded = decode_tokens(plan.decode, outcome)
    processed = sum(c.tokens for c in plan.prefill) + sum(decoded.values())
    return decoded, outcome.elapsed_s / processed if processed else 0.0


def decode_tokens(decode: Iterable[RequestId], outcome: Outcome) -> dict[RequestId, int]:
    """The tokens each decode row yielded (`Outcome.tokens_of` of each), by request."""
    if outcome.produced is None:
        return dict.fromkeys(decode, outcome.steps)
    produced = outcome.produced
    return {rid: produced.get(rid, 0) for rid in decode}


def _advance_other(r: Request, chunk, outcome: Outcome, charge: TenantCharge) -> tuple[int, float]:
    """Apply a row that does not decode (a prefill chunk, or nothing this step): (tokens processed,
    KV held on average)."""
    if chunk is not None:
        r.computed += chunk.tokens
        charge.prefill_tokens += chunk.tokens
        if chunk.produces_token:
            r.generated += outcome.tokens_of(r.id)
        return chunk.tokens, r.computed
    return 0, r.computed
