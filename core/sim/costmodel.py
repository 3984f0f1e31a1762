"""Engine step time as a function of the work in the step.

    step_s = base_s + token_s * tokens + kv_token_s * kv_held + swap_token_s * swapped

The defaults model an ~8B GQA model (128 KiB of KV per token) on one
H100-class GPU: a decode step reads the weights (~16 GB at ~3 TB/s, plus
launch overhead: base 8 ms), each processed token costs ~60 us of compute
(~16k prefill tokens/s), each KV token held is read once per step (128 KiB
at ~3 TB/s: ~45 ns), and parking or restoring KV crosses PCIe (128 KiB at
~45 GB/s: ~3 us a token). bench/calibrate.py fits the same shape to the real
engine; the simulator only needs them to be the right shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class CostModel:
    base_s: float = 0.008
    token_s: float = 60e-6
    kv_token_s: float = 45e-9
    swap_token_s: float = 3e-6

    def __post_init__(self) -> None:
        for name in ("base_s", "token_s", "kv_token_s", "swap_token_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.base_s == 0 and self.token_s == 0:
            raise ValueError("a step must take time: base_s or token_s > 0")

    def step_s(self, tokens: int, kv_held: int, swapped: int = 0) -> float:
        """Seconds one engine step takes."""
        return (
            self.base_s
            + self.token_s * tokens
            + self.kv_token_s * kv_held
            + self.swap_token_s * swapped
        )

    def decode_run_s(self, steps: int, batch: int, kv_held: int) -> float:
        """Seconds `steps` decode-only steps of `batch` requests take.

        The KV held grows by `batch` a step: step k holds kv_held + k * batch.
        """
        if steps <= 0:
            return 0.0
        per_step = self.base_s + self.token_s * batch + self.kv_token_s * kv_held
        growth = self.kv_token_s * batch * steps * (steps - 1) / 2
        return per_step * steps + growth

    def decode_steps_within(self, budget_s: float, batch: int, kv_held: int) -> int:
        """The fewest decode steps whose total time reaches `budget_s` (>= 1)."""
        if budget_s <= 0:
            return 1
        a = self.kv_token_s * batch / 2
        b = self.base_s + self.token_s * batch + self.kv_token_s * kv_held - a
        if a == 0:
            steps = math.ceil(budget_s / b)
        else:
            steps = math.ceil((-b + math.sqrt(b * b + 4 * a * budget_s)) / (2 * a))
        steps = max(1, steps)
        # Correct floating-point error at the boundary.
        while steps > 1 and self.decode_run_s(steps - 1, batch, kv_held) >= budget_s:
            steps -= 1
        while self.decode_run_s(steps, batch, kv_held) < budget_s:
            steps += 1
        return steps


def paced_profile(step_s: float) -> CostModel:
    """The paced stand-in engine (tests/support/paced_engine.py) as a cost model.

    That engine computes nothing: every `step_s` it gives each running
    request one token, whatever the prompts or the KV held, and a request
    that joins gets its first token at the end of the step it joins. So a
    step costs `step_s` flat (a prefill step included: its first token comes
    with it), and tokens, KV and parking cost nothing. Its slots are the
    batch: simulate with `--max-batch` set to them.
    """
    return CostModel(base_s=step_s, token_s=0.0, kv_token_s=0.0, swap_token_s=0.0)


# Named engines the simulator can stand in for.
#  - "tiny-cpu": fitted to fsched's own engine (runner + scheduler) serving the
#    built-in tiny model on a 2-core CPU with 2 threads, by
#    `python bench/calibrate.py` (docs/benchmarks.md gives the fit). The engine
#    a fresh `fsched daemon` runs, so it is `fsched simulate`'s default.
#  - "h100-8b": the analytic model above (an ~8B GQA model on one H100-class
#    GPU); docs/scheduling.md's Azure-trace figures use it.
#  - "paced": the paced stand-in engine at its default pace (20 ms a step),
#    what `fsched replay` is checked against live (docs/scheduling.md).
PROFILES: dict[str, CostModel] = {
    "tiny-cpu": CostModel(base_s=1.140e-02, token_s=3.449e-04, kv_token_s=1.516e-06, swap_token_s=1.088e-05),
    "h100-8b": CostModel(),
    "paced": paced_profile(0.020),
}
DEFAULT_PROFILE = "tiny-cpu"
