"""Per-key rate limits at the door: 429 with Retry-After, in OpenAI's error shape.

The limits on a key are read from the table and kept for LIMITS_TTL_S (api/state.py; an
admin's change applies within it); the counting is the table's
(`KeyStore.take_rate`), shared by every replica of `fsched serve`. A key with
no limit costs no write. What a request costs: one request, and the tokens
it may generate (max_tokens for each choice, its logprobs counted as the
table-wide `logprobs_per_charged_token` says; a choice that names no max_tokens,
whose bound is the room its model's context leaves, counts UNSIZED_COST tokens).
"""

from __future__ import annotations

import math

from fsched.api.errors import ApiError
from fsched.api.state import ServerState
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.ratelimit import charged_tokens, never_fits
from fsched.core.openai.online import OnlineRequest
from fsched.core.types import SamplingParams

UNSIZED_COST = 1024  # the tokens counted for a choice without max_tokens (the server knows no context)


def costs_of(online: OnlineRequest, logprobs_per_token: int) -> dict[str, int]:
    return {"requests": 1, "tokens": sum(charged_tokens(_sized(spec.params), spec.params.logprobs,
                                                        logprobs_per_token) for spec in online.specs)}


def _sized(params: SamplingParams) -> int:
    return min(params.max_tokens, UNSIZED_COST) if params.max_tokens_is_default else params.max_tokens


async def admit(state: ServerState, key: ApiKey, online: OnlineRequest) -> None:
    """Let the request through, or refuse it: 429 (Retry-After) over a limit, 400 for one that never fits."""
    limits = await state.rate_limits(key.id)
    if not limits:
        return
    costs = costs_of(online, (await state.limits()).logprobs_per_charged_token)
    too_big = never_fits(limits, costs)
    if too_big is not None:
        raise ApiError(400, f"this request may generate {costs['tokens']:,} tokens (logprobs counted), more "
                            f"than key {key.id}'s limit of {limits[too_big]:,} a minute ({too_big}); ask for "
                            "fewer max_tokens", "max_tokens", "rate_limit_exceeded")
    decision = await state.call(state.backend.keys.take_rate, key.id, limits, costs)
    if not decision.allowed:
        wait = max(1, math.ceil(decision.retry_after_s))
        name = decision.refused_by
        raise ApiError(429, f"rate limit reached for key {key.id}: {limits[name]:,} "
                            f"{name.removesuffix('_per_minute')} per minute ({name}); retry in {wait} s",
                       code="rate_limit_exceeded", headers={"Retry-After": str(wait)})
