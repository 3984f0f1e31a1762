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
    whole minimum quantum goes first: nothing admitted stalls forever behind
    a stream of better-ranked prefills. A chunk that completes the prefill of a
    request `due` says is due within this step ends the step's prefill: the
    chunks after it would lengthen the step and push its first token back."""
    decode: list[RequestId] = []
    prefilling: list[tuple[tuple, Request]] = []
    for r in running:
        if r.pending_prefill == 0:
            decode.append(r.id)
        else:
            prefilling.append(((r.idle_steps < min_quantum, rank(r)), r))
    budget -= len(decode)
    prefilling.sort(key=lambda item: item[0])
    chunks: list[PrefillChunk] = []
    for _, r in prefilling:
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
