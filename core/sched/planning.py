"""Turning the running set into one step: prefill chunks, decode rows, repeatable steps."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan, Preemption, PrefillChunk
from fsched.core.sched.request import Request
from fsched.core.types import RequestId


def split_rows(running: Iterable[Request], rank: Callable[[Request], tuple], budget: int,
               min_quantum: int, due: Callable[[Request], bool] | None = None
               ) -> tuple[list[RequestId], list[PrefillChunk]]:
    """Decode rows for every decoding request, then prefill chunks within the
    token budget left, by rank, except that a prefill starved of budget for a
    whole minimum quantum goes first (`prefill_order`): nothing admitted stalls
    forever behind a stream of better-ranked prefills. A chunk that completes
    the prefill of a request `due` says is due within this step ends the step's
    prefill: the chunks after it would lengthen the step and push its first
    token back."""
    decode: list[RequestId] = []
    prefilling: list[Request] = []
    for r in running:
        # `r.pending_prefill == 0` (request.py), spelled out: a property call a row a step is most of
        # this loop's cost
        computed, context = r.computed, r.prompt_tokens + r.generated
        if computed == context or (computed == context - 1 and r.generated > 0):
            decode.append(r.id)
        else:
            prefilling.append(r)
    budget -= len(decode)
    chunks: list[PrefillChunk] = []
    for r in prefill_order(prefilling, rank, min_quantum, due):
        if budget <= 0:
            break
        pending = r.pending_prefill
        n = min(pending, budget)
        if n == pending - 1:
            # Never stop a prefill one token short: `computed == context - 1`
            # is what a decoding request looks like (pending_prefill 0), and a
            # resumed request (generated > 0) would be planned as decoding.
            n -= 1
            if n == 0:
                continue
        chunks.append(PrefillChunk(r.id, r.computed, n, n == pending))
        budget -= n
        if n == pending and due is not None and due(r):
            break
    return decode, chunks


def prefill_order(prefilling: Iterable[Request], rank: Callable[[Request], tuple], min_quantum: int,
                  due: Callable[[Request], bool] | None = None) -> list[Request]:
    """The order in which running prefills take a step's budget: by rank, except that a prefill
    starved of budget for a minimum quantum goes ahead of every better-ranked one but a `due` one
    (a realtime first token still before its target), and one starved for two quanta goes first.

    Why the exception: a due prefill is a few steps from its target (realtime: 0.5 s, about four
    full steps), and a starved chunk in one of them costs it the target, while the starved prefill
    waits a step or two more for nothing its class is measured by. A due prefill is due only until
    its deadline, so the exception ends; the second quantum bounds it whatever arrives."""
    ranked = [(rank(r), r) for r in prefilling]
    starved = [key for key, r in ranked if min_quantum <= r.idle_steps < 2 * min_quantum]
    worst_starved = max(starved) if starved else None

    def tier(key: tuple, r: Request) -> int:
        if r.idle_steps >= 2 * min_quantum:
            return 0
        if r.idle_steps >= min_quantum:
            return 1
        if worst_starved is not None and key < worst_starved and due is not None and due(r):
            return 1  # stays ahead of the starved prefills it outranks
        return 2

    ranked.sort(key=lambda item: (tier(*item), item[0]))
    return [r for _, r in ranked]


def stable_steps(running: Iterable[Request], config: SchedulerConfig, kv_committed: int,
                 n_decode: int, quantum_ends: bool) -> int:
    """Steps a decode-only plan can repeat before a decision is due: a request
    reaching max_tokens, KV pressure, and (when work waits and the policy
    preempts) a minimum quantum ending, which makes a victim."""
    steps = (config.kv_tokens - kv_committed) // n_decode + 1  # memory pressure
    mq = config.min_quantum_steps
    for r in running:
        left = r.max_tokens - r.generated
        if left < steps:
            steps = left
        if quantum_ends and r.run_steps < mq and mq - r.run_steps < steps:
            steps = mq - r.run_steps
    return max(1, steps)


def compose_plan(step: int, running: Collection[Request], rank: Callable[[Request], tuple],
                 config: SchedulerConfig, changes: tuple[list[Preemption], list[RequestId], list[RequestId]],
                 kv_committed: int, swap_tokens: int, quantum_ends: bool,
                 due: Callable[[Request], bool] | None = None) -> Plan:
    """The plan of one step (repeatable when only decodes run and nothing changed);
    `changes` are this step's preemptions, resumed and admitted request ids; `due` as in
    `split_rows`."""
    preempted, resumed, admitted = changes
    decode, chunks = split_rows(running, rank, config.step_tokens, config.min_quantum_steps, due)
    steps = 1
    if decode and not (chunks or preempted or admitted):
        steps = stable_steps(running, config, kv_committed, len(decode), quantum_ends)
    return Plan(step=step, prefill=tuple(chunks), decode=tuple(decode), preempted=tuple(preempted),
                resumed=tuple(resumed), admitted=tuple(admitted), kv_tokens=kv_committed,
                swap_tokens=swap_tokens, stable_steps=steps)
