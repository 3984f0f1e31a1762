"""When a request stops, as a pure function of what it has produced."""

from __future__ import annotations

from dataclasses import dataclass

from fsched.core.types import RequestStatus


@dataclass(slots=True, frozen=True)
class StopCheck:
    finished: RequestStatus | None  # FINISHED_STOPPED or FINISHED_LENGTH; None: going on
    text_end: int | None = None  # cut the text here (before, or just after, a stop string)
    on_token: bool = False  # ended by its last token (EOS or a stop token), which the text leaves out


@dataclass(slots=True, frozen=True)
class StopRules:
    """What ends a request besides its length (from its SamplingParams; all off by default)."""

    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop: bool = False  # keep the stop string in the text


def check_stop(
    token: int,
    generated: int,
    max_tokens: int,
    context: int,
    context_limit: int,
    eos_token_ids: frozenset[int],
    text: str | None = None,
    stop: tuple[str, ...] = (),
    rules: StopRules | None = None,
) -> StopCheck:
    """Whether the request that just produced `token` (its `generated`-th) is done.

    Nothing but the length ends a request before `min_tokens`; `ignore_eos`
    turns EOS into an ordinary token; a stop token ends it as EOS does.
    """
    rules = rules or StopRules(stop=stop)
    if generated >= rules.min_tokens:
        if (token in eos_token_ids and not rules.ignore_eos) or token in rules.stop_token_ids:
            return StopCheck(RequestStatus.FINISHED_STOPPED, on_token=True)
        if rules.stop and text is not None:
            found = [(i, s) for s in rules.stop if (i := text.find(s)) >= 0]
            if found:
                cut, first = min(found)
                end = cut + len(first) if rules.include_stop else cut
                return StopCheck(RequestStatus.FINISHED_STOPPED, end)
    if generated >= max_tokens or context >= context_limit:
        return StopCheck(RequestStatus.FINISHED_LENGTH)
    return GOING


GOING = StopCheck(None)  # not finished: one shared value (asked of every token)


def stop_rules(params) -> StopRules:
    """A request's stop rules (`params` a SamplingParams)."""
    return StopRules(params.stop, frozenset(params.stop_token_ids), params.ignore_eos, params.min_tokens,
                     params.include_stop_str_in_output)
