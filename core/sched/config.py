"""Every scheduling tunable in one validated dataclass, each default with its reason.

The defaults describe one modern GPU serving an ~8B GQA model (the cost
model in `costmodel.py` uses the same machine) and were tuned on the Azure
conversation trace with `bench/simulate.py`; docs/scheduling.md gives the
measurements behind them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsched.core.types import RequestClass

REALTIME_TTFT_TARGET_S = 0.5  # the realtime first-token target fsched promises


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
    # Whether a step's prefill ends at a realtime prefill that yields its first token (policy.due):
    # on an engine whose step fsched composes, the chunks after it would lengthen that step. A remote
    # engine composes its own iterations (it batches every prompt it has in its next one), so there
    # the cut shortens nothing and only holds the other new requests' streams back a step each: eight
    # realtime requests arriving together under a full batch then opened one per step.
    cut_prefill_for_first_token: bool = True

    # --- ordering and preemption -----------------------------------------
    # First-token targets per class, what each class's figures are reported
    # against (the fraction on target). Realtime 0.5 s is what an
    # interactive caller notices; streaming 2 s is a chat reply starting
    # while its reader still reads the question; batch 60 s: batch has a
    # completion window of hours, and a minute is where a queue of batch
    # work stops being a short one. Realtime and streaming meet theirs by
    # precedence; batch by its tenant's share (see docs/scheduling.md: the
    # batch bound). Late batch is not promoted across tenants: that would let
    # a tenant inside the share slack take the other's turns, and ordering
    # across tenants is the weights' job.
    realtime_target_s: float = REALTIME_TTFT_TARGET_S
    streaming_target_s: float = 2.0
    batch_target_s: float = 60.0
    # A tenant is within its share while its score (dominant use over
    # weight) is at most (1 + share_slack) x the lowest score among tenants
    # with work waiting. 5%: a weight-1 tenant next to a weight-3 one then
    # takes at most 0.25 x 1.05 = 0.26 of the machine through precedence,
    # inside the +-0.03 the weights promise, while the usual jitter of the
    # scores (one request's reservation against minutes of decayed usage)
    # does not flip a tenant in and out of its share.
    share_slack: float = 0.05
    # Precedence compares a tenant's recent realtime and streaming use with
    # its entitled share, as a fraction of the decayed engine time; while
    # that time is shorter than this (a run's or a daemon's first minute) it
    # counts as this long. Without it, one long prompt in the first seconds
    # is most of the window and its tenant loses precedence for the next
    # minute. A minute is several times the longest prompt the KV budget
    # admits (131k tokens: about 8 s of prefill on the modelled GPU), so one
    # prompt alone never takes a weight-1 tenant next to a weight-3 one past
    # its 0.25; what a tenant can gain is bounded by its share of that
    # minute, whatever it labels. 0 measures from the first step.
    precedence_warmup_s: float = 60.0
    # Inside a tenant's line of a class the work that can still make its
    # target goes first (lines.py; realtime and streaming the shortest
    # prefill first); a request that has waited this many times its class's
    # target goes ahead of those, oldest first, so no wait grows without
    # bound behind newer or shorter work. 4: realtime ages at 2 s, streaming
    # at 8 s, batch at 4 minutes, well after each target is lost (a request
    # aging earlier would displace ones still on time), and short against
    # what an interactive caller tolerates before giving up, or against
    # batch's completion window of hours.
    aging_factor: float = 4.0
    # A (re)admitted request runs at least this many engine steps before it
    # can be preempted again: no thrashing, and preempted work progresses.
    # 16 steps ~ 0.3-0.5 s of decoding: below the realtime target.
    min_quantum_steps: int = 16
    # A request is preempted at most this many times; after that it runs to
    # completion. Parking is cheap, but each preemption still moves its KV
    # twice over the host link and puts it back in the queue.
    max_preemptions: int = 2
    # A precedence request that does not fit waits instead of preempting
    # when a running request reaches its max_tokens within this many steps,
    # unless it can still make its target (policy.grace): the wait then
    # spares a checkpoint where it costs nothing the class is measured by.
    preempt_grace_steps: int = 2
    # With no host room to park, a victim is dropped and recomputed only if
    # it holds at most this many KV tokens (one prefill chunk's worth by
    # default): a long prompt is not re-prefilled to save a short wait.
    max_recompute_tokens: int = 2048

    # Admit requests behind a head that does not fit when that leaves the
    # head's reservation where it was (backfill.py). Off only for ablation.
    backfill: bool = True

    # --- tenant usage (weighted DRF) --------------------------------------
    # Half-life of the decayed usage. Long against a request (~10 s) so
    # shares integrate thousands of requests, and long enough that DRF can
    # make up, on a tenant's batch work, for the realtime and streaming work
    # that class order served first (docs/scheduling.md). 10 minutes keeps
    # yesterday's (or the last hour's) heavy user from being punished now.
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
        _positive_finite("usage_half_life_s", self.usage_half_life_s)
        _positive_finite("default_weight", self.default_weight)
        for name in ("realtime_target_s", "streaming_target_s", "batch_target_s"):
            _positive_finite(name, getattr(self, name))
        if not (math.isfinite(self.aging_factor) and self.aging_factor >= 1):
            raise ValueError("aging_factor must be a finite number >= 1 (a request ages after its target)")
        if not (math.isfinite(self.precedence_warmup_s) and self.precedence_warmup_s >= 0):
            raise ValueError("precedence_warmup_s must be a finite number >= 0")
        if not (math.isfinite(self.share_slack) and self.share_slack >= 0):
            raise ValueError("share_slack must be a finite number >= 0")
        _positive_int("min_quantum_steps", self.min_quantum_steps)
        _positive_int("max_preemptions", self.max_preemptions)
        if self.preempt_grace_steps < 0 or self.max_recompute_tokens < 0:
            raise ValueError("preempt_grace_steps and max_recompute_tokens must be >= 0")
        if self.min_quantum_steps * self.max_batch >= self.kv_tokens:
            raise ValueError("kv_tokens must exceed max_batch * min_quantum_steps (the reserve)")

    def target_s(self, request_class: RequestClass) -> float:
        """The first-token target of a class."""
        if request_class is RequestClass.REALTIME:
            return self.realtime_target_s
        return self.streaming_target_s if request_class is RequestClass.STREAMING else self.batch_target_s


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer")


def _positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number")
