"""Every scheduling tunable in one validated dataclass (DESIGN §3, §7.1).

The defaults describe one modern GPU serving an ~8B GQA model (the cost
model in `costmodel.py` uses the same machine) and were tuned on the Azure
conversation trace with `bench/simulate.py`; docs/scheduling.md gives the
measurements behind them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REALTIME_TTFT_TARGET_S = 0.5  # DESIGN §2: realtime first-token target


@dataclass(slots=True)
class SchedulerConfig:
    # --- limits of one engine step -------------------------------------
    # Requests in the running batch. 64 keeps decode steps memory-bound
    # (cheap per extra request) on the modelled GPU; more buys little.
    max_batch: int = 64
    # KV cache budget on the device, in token slots (prompt + generated
    # tokens of every running request). 128k slots ~ 16 GiB of KV for an
    # 8B GQA model at 128 KiB/token; the trace's mean context is ~1.4k, so
    # a full batch of 64 fits with headroom.
    kv_tokens: int = 131_072
    # Tokens processed in one step (decodes + prefill chunks). Chunked
    # prefill at 2048 keeps a prefill step near 130 ms on the cost model,
    # so a realtime request waits at most one such step behind a long
    # prompt, while the GPU stays compute-bound during prefill.
    step_tokens: int = 2048
    # Host (CPU) memory for parked KV of preempted requests, in token
    # slots. 4x the device budget: host RAM is plentiful, and parking costs
    # a PCIe copy instead of a full recompute.
    host_kv_tokens: int = 524_288

    # --- ordering --------------------------------------------------------
    # A waiting request's band improves by one per `aging_s` waited since it
    # last ran; after (band + 1) * aging_s its MLFQ level and base priority
    # are boosted to the top too (MLFQ's anti-starvation boost). 10x the
    # realtime first-token target: aging never blurs the class order for
    # queues that drain within a few seconds, and a batch request reaches
    # the top band within 2 * 5 s = 10 s however busy the machine is.
    aging_s: float = 10 * REALTIME_TTFT_TARGET_S
    # Skip-join MLFQ: a request enters the first level whose prompt bound
    # it fits (<=512 -> 0, <=2048 -> 1, <=8192 -> 2, else 3), so long
    # prefills start lower (FastServe). Length = number of levels - 1.
    skip_join_prompt: tuple[int, ...] = (512, 2048, 8192)
    # Output tokens a request may decode at each level before demotion to
    # the next (the last level never demotes). Geometric, as in MLFQ: the
    # trace's median output is ~130 tokens, so most realtime answers
    # finish within levels 0-1.
    quanta: tuple[int, ...] = (64, 256, 1024)
    # A (re)admitted request runs at least this many engine steps before it
    # can be preempted again: no thrashing, and aged work progresses.
    # 16 steps ~ 0.3-0.5 s of decoding: below the realtime target, so a
    # realtime arrival facing a batch admitted just now is still on time.
    min_quantum_steps: int = 16

    # --- tenant usage (weighted DRF) --------------------------------------
    # Half-life of the decayed usage. Long against a request (~10 s) so
    # shares integrate thousands of requests, and long enough that DRF can
    # make up, on a tenant's batch work, for the realtime and streaming work
    # that class order served first: on the Azure trace at 3x, 120 s gave
    # Jain 0.984, 600 s 0.994, 1800 s 0.998. 10 minutes keeps yesterday's
    # (or the last hour's) heavy user from being punished now.
    usage_half_life_s: float = 600.0
    # Lift a returning idle tenant's usage to the lowest active share
    # (VTC's counter lift). Off only for ablation tests.
    lift_idle_tenants: bool = True
    # Default weight of a tenant nobody configured.
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        _positive_int("max_batch", self.max_batch)
        _positive_int("kv_tokens", self.kv_tokens)
        _positive_int("step_tokens", self.step_tokens)
        if self.step_tokens <= self.max_batch:
            raise ValueError("step_tokens must exceed max_batch so prefill can always progress")
        if self.host_kv_tokens < 0:
            raise ValueError("host_kv_tokens must be >= 0")
        _positive_finite("aging_s", self.aging_s)
        _positive_finite("usage_half_life_s", self.usage_half_life_s)
        _positive_finite("default_weight", self.default_weight)
        if self.min_quantum_steps < 1:
            raise ValueError("min_quantum_steps must be >= 1")
        if any(b < 1 for b in self.skip_join_prompt) or list(self.skip_join_prompt) != sorted(
            set(self.skip_join_prompt)
        ):
            raise ValueError("skip_join_prompt must be strictly increasing positive bounds")
        if len(self.quanta) != len(self.skip_join_prompt) or any(q < 1 for q in self.quanta):
            raise ValueError("quanta needs one positive quantum per non-final level")
        if self.min_quantum_steps * self.max_batch >= self.kv_tokens:
            raise ValueError("kv_tokens must exceed max_batch * min_quantum_steps (the reserve)")

    @property
    def levels(self) -> int:
        """Number of MLFQ levels."""
        return len(self.skip_join_prompt) + 1

    def entry_level(self, prompt_tokens: int) -> int:
        """Skip-join: the first level whose prompt bound the prompt fits."""
        for level, bound in enumerate(self.skip_join_prompt):
            if prompt_tokens <= bound:
                return level
        return len(self.skip_join_prompt)


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer")


def _positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number")
