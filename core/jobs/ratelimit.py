"""Per-key rate limits: requests and tokens a minute, decided by GCRA on the database's clock.

The generic cell rate algorithm keeps one number a limit: the theoretical
arrival time (TAT), when what was let through would have been spent at the
limit's pace. A request of cost c is let through when, after adding c
intervals (60 s / limit each), the TAT is at most a minute ahead of now; so a
key may spend a minute's worth at once, then at the limit's pace. A refused
request changes nothing and is told how long to wait (Retry-After). Unlike a
fixed window, it never lets twice the limit through across a window's edge.

Tokens are what a request may generate: max_tokens for each of its choices,
and for logprobs one token more for every `logprobs_per_charged_token`
records (a table-wide limit) they may make, counted when it is admitted (the
prompt's length is not known before the daemon tokenizes it). A request
asking more tokens than the limit allows in a minute can never pass: it is
refused apart (`never_fits`), not told to retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

WINDOW_S = 60.0
# Each limit, and the kind of rate (a row of key_rates) it bounds.
RATE_KINDS = {"requests_per_minute": "requests", "tokens_per_minute": "tokens"}
RATE_NAMES = tuple(RATE_KINDS)
_SLACK_S = 1e-6  # float rounding of many intervals must not refuse the last one of a minute


@dataclass(slots=True, frozen=True)
class RateDecision:
    """Whether a request passes; if so each kind's new TAT, else how long until it would."""

    allowed: bool
    retry_after_s: float
    tats: Mapping[str, float]
    refused_by: str | None = None  # the limit's name that refused it


def gcra(tat: float | None, now: float, per_minute: int, cost: int) -> tuple[bool, float, float]:
    """One limit's answer for a request of `cost`: (allowed, the TAT after it, seconds to wait)."""
    interval = WINDOW_S / per_minute
    after = max(tat if tat is not None else now, now) + interval * cost
    wait = after - WINDOW_S - now
    if wait <= _SLACK_S:
        return True, after, 0.0
    return False, tat if tat is not None else now, wait


def decide(tats: Mapping[str, float | None], now: float, limits: Mapping[str, int],
           costs: Mapping[str, int]) -> RateDecision:
    """Every limit of `limits` (name -> per minute) must let the request through; the kinds' TATs
    (kind -> TAT, None for a key not seen yet) move only when all do."""
    after: dict[str, float] = {}
    worst, refused_by = 0.0, None
    for name, per_minute in limits.items():
        kind = RATE_KINDS[name]
        ok, tat, wait = gcra(tats.get(kind), now, per_minute, costs.get(kind, 0))
        after[kind] = tat
        if not ok and wait > worst:
            worst, refused_by = wait, name
    if refused_by is not None:
        return RateDecision(False, worst, {}, refused_by)
    return RateDecision(True, 0.0, after)


def charged_tokens(max_tokens: int, logprobs: int | None, logprobs_per_token: int) -> int:
    """What one choice costs the tokens-a-minute limits: its max_tokens, and for a choice asking
    logprobs (`logprobs` alternatives a token) one token more for every `logprobs_per_token` records
    it may make (its tokens' own and their alternatives')."""
    if logprobs is None:
        return max_tokens
    return max_tokens + -(-max_tokens * (logprobs + 1) // logprobs_per_token)


def never_fits(limits: Mapping[str, int], costs: Mapping[str, int]) -> str | None:
    """The limit a request of these costs can never pass (more than a minute's worth), if any."""
    for name, per_minute in limits.items():
        if costs.get(RATE_KINDS[name], 0) > per_minute:
            return name
    return None


def rate_limits_of(table_wide: Mapping[str, int], per_key: Mapping[str, int]) -> dict[str, int]:
    """The rate limits on one key: its own where an admin set one, else the table's; none: unlimited."""
    return {name: int(per_key.get(name, table_wide.get(name))) for name in RATE_NAMES
            if name in per_key or name in table_wide}
