"""When a request stops, as a pure function of what it has produced."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS token or a stop string (OpenAI's word for both)
    LENGTH = "length"  # max_tokens, or the model's context is full


@dataclass(slots=True, frozen=True)
class StopCheck:
    finished: FinishReason | None
    text_end: int | None = None  # cut the text here (before a stop string)


def check_stop(
    token: int,
    generated: int,
    max_tokens: int,
    context: int,
    context_limit: int,
    eos_token_ids: frozenset[int],
    text: str | None = None,
    stop: tuple[str, ...] = (),
) -> StopCheck:
    """Whether the request that just produced `token` (its `generated`-th) is done."""
    if token in eos_token_ids:
        return StopCheck(FinishReason.STOP)
    if stop and text is not None:
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            return StopCheck(FinishReason.STOP, cut)
    if generated >= max_tokens or context >= context_limit:
        return StopCheck(FinishReason.LENGTH)
    return StopCheck(None)
