"""The starvation bound fsched's docs state, as a pure function.

Setting: work of a better class keeps the engine saturated (a realtime
flood); one request B of class band `band` (batch: 2) with `prompt` and
`output` tokens waits. Assumptions: B's KV can be parked when it is
preempted (host pool room), and no older waiting work of B's own tenant,
nor a tenant with a lower share, is ahead of B once B is fully aged (the
flood is younger than B, or it comes from a tenant with more usage).

One cycle of B:
1. waits `(band + 1) * aging_s` since it last ran: then its band, level and
   base priority are at the top and it is the best waiter;
2. waits for a free slot: B cannot preempt better classes, so until a
   running request finishes. No one is admitted before that, so the
   prefills already running (at most max_batch * P_o tokens, at least c a
   step) finish within max_batch * ceil(P_o / c) steps, and then every
   running request decodes each step: a slot frees within
   max_batch * ceil(P_o / c) + L_o steps, with P_o, L_o the other requests'
   longest prompt and output and c = step_tokens - max_batch the prefill
   budget left in a full step;
3. runs its minimum quantum: `mq` steps with progress, a prefill step
   taking at most mq + 1 steps (a starved prefill goes first after mq idle
   steps); then the flood preempts it (KV parked).

B prefills in p = ceil(prompt / c) chunks and yields its first token with
the last one, so the first cycle yields at least mq - p + 1 tokens and each
later one (decode only) mq; it completes within
    k = 1 + ceil(max(0, output - (mq - p + 1)) / mq)       cycles,
    bound = k * ((band + 1) * aging_s + (steps of 2 and 3) * t_max)
plus parking and restoring B's context once a cycle, where t_max is the
longest step without swaps (a full token budget, a full KV cache; the flood
is never preempted, so B's own checkpoint is the only swap). Requires
mq > p.
"""

from __future__ import annotations

import math

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sim.costmodel import CostModel


def longest_step_s(config: SchedulerConfig, cost: CostModel) -> float:
    """A full token budget over a full KV cache, no swaps."""
    return cost.step_s(config.step_tokens, config.kv_tokens)


def completion_bound_s(
    config: SchedulerConfig,
    cost: CostModel,
    *,
    prompt: int,
    output: int,
    other_prompt: int,
    other_output: int,
    band: int = 2,
) -> float:
    """Seconds within which B completes under a saturating better-class flood."""
    mq = config.min_quantum_steps
    c = config.step_tokens - config.max_batch
    p = math.ceil(prompt / c)
    if mq <= p:
        raise ValueError("the bound needs min_quantum_steps > the request's prefill chunks")
    cycles = 1 + math.ceil(max(0, output - (mq - p + 1)) / mq)
    slot_wait = config.max_batch * math.ceil(other_prompt / c) + other_output
    run = p * (mq + 1) + mq
    swap = 2 * (prompt + output) * cost.swap_token_s
    per_cycle = (
        (band + 1) * config.aging_s + (slot_wait + run) * longest_step_s(config, cost) + swap
    )
    return cycles * per_cycle
