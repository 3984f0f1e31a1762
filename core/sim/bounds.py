"""The batch bound fsched's docs state, as a pure function.

Setting: another tenant F floods the engine with realtime work (more than
the machine serves); one batch request B of tenant t (t and F of equal
weight, t with no other work) waits. Then:

1. F's realtime work has precedence only while F's recent realtime and
   streaming use is within its entitled share (half, plus the slack) of a
   window at least `precedence_warmup_s` long. A flood that fills the
   machine uses all of it, so once it has used its share of that window
   (at most half x (1 + slack) x precedence_warmup_s seconds, all of them
   at the start of a run) F's work competes in the share tier, by tenant
   score, where B (its tenant has used almost nothing) ranks first.
2. B waits for a free slot: B may not preempt, so until a running request
   finishes. No one is admitted before B, so the prefills already running
   (at most max_batch * P_o tokens, at least c a step) finish within
   max_batch * ceil(P_o / c) steps, and then every running request decodes
   each step: a slot frees within max_batch * ceil(P_o / c) + L_o steps,
   with P_o, L_o the flood's longest prompt and output and
   c = step_tokens - max_batch the prefill budget left in a full step.
3. Admitted, B's prefill chunks outrank F's (B's tenant scores lower), so
   B yields its first token after ceil(prompt / c) steps.

So B's first token comes within
    0.5 * (1 + slack) * precedence_warmup_s
      + (max_batch * ceil(P_o / c) + L_o + ceil(prompt / c)) * t_max
where t_max is the longest step (a full token budget over a full KV cache).
When B's own tenant floods (its realtime work within its own share), B
waits behind it: class precedence inside a share is the contract, and
under saturation the weights, not a bound, decide who waits.
"""

from __future__ import annotations

import math

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sim.costmodel import CostModel


def longest_step_s(config: SchedulerConfig, cost: CostModel) -> float:
    """A full token budget over a full KV cache, no swaps."""
    return cost.step_s(config.step_tokens, config.kv_tokens)


def first_token_bound_s(config: SchedulerConfig, cost: CostModel, *, prompt: int, other_prompt: int,
                        other_output: int) -> float:
    """Seconds within which B yields its first token under another tenant's realtime flood."""
    c = config.step_tokens - config.max_batch
    slot_wait = config.max_batch * math.ceil(other_prompt / c) + other_output
    return (precedence_head_start_s(config, 0.5)
            + (slot_wait + math.ceil(prompt / c)) * longest_step_s(config, cost))


def precedence_head_start_s(config: SchedulerConfig, entitled: float) -> float:
    """The most a tenant entitled to `entitled` of the machine can run through precedence
    before its use counts against it: its share (with the slack) of the warm-up window."""
    return entitled * (1.0 + config.share_slack) * config.precedence_warmup_s
