"""When a request stops, as a pure function of what it has produced."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fsched.core.runners.detokenize import Step, fed, stream_of
from fsched.core.types import RequestStatus, StopCheck


@dataclass(slots=True, frozen=True)
class StopRules:
    """What ends a request besides its length (from its SamplingParams; all off by default)."""

    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop: bool = False  # keep the stop string in the text


@dataclass(slots=True)
class StopText:
    """A request's output text, read as its tokens come, and where a stop string may still begin: the
    cost of a token is its own text plus a window of the longest stop string, never the whole output.

    `extend` adds the text of the tokens not yet read, decoding only those and the
    one or few before them (the offsets vLLM's detokenizer keeps: a token's text
    can depend on its neighbours, and a character split over tokens is held back
    until it is whole). `first_stop` looks for the stop strings from `checked`
    on, which then moves to where the longest could still begin; a match is
    confirmed on the whole text, decoded once, so where the text is cut is
    exactly what decoding the whole output says. A decode that can stream (a
    fast tokenizer's backend, core/runners/hf/decoding.py) is fed the new tokens
    instead, settling text exactly as that window does, in one call a step.
    """

    stops: tuple[str, ...]
    decode: Callable[[Sequence[int]], str]
    start: int = 0  # where the output begins in the tokens `extend` is given (after the prompt)
    text: str = ""
    checked: int = 0  # no stop string begins before this index of `text`
    _tokens: Sequence[int] = ()
    _prefix: int = 0  # output tokens [_prefix:_read] decode to the end of `text` (context for the next)
    _read: int = 0  # output tokens whose text is in `text`
    _longest: int = field(init=False)
    _stream: Step | None = field(init=False, default=None)
    _fed: int = 0  # output tokens the stream was given

    def __post_init__(self) -> None:
        self._longest = max(map(len, self.stops), default=1)
        self._stream = stream_of(self.decode)

    def extend(self, tokens: Sequence[int]) -> None:
        """Read the output tokens of `tokens` (from `start` on) that come after the last read."""
        self._tokens, start = tokens, self.start
        if self._stream is not None:
            self._streamed(tokens)
            return
        if len(tokens) - start <= self._read:
            return
        before = self.decode(tokens[start + self._prefix : start + self._read])
        after = self.decode(tokens[start + self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(tokens) - start

    def _streamed(self, tokens: Sequence[int]) -> None:
        new = tokens[self.start + self._fed:]
        if not new:
            return
        try:
            piece = fed(self._stream, new)
        except Exception:  # a decoder that rewrote earlier text: the window's way, from the start
            self._stream, self.text, self.checked = None, "", 0
            self.extend(tokens)
            return
        self._fed += len(new)
        if piece is not None:
            self.text += piece

    def first_stop(self, include: bool) -> int | None:
        """Where to cut the text for its first stop string (after it if `include`), or None."""
        start, self.checked = self.checked, max(0, len(self.text) - self._longest + 1)
        if not any(self.text.find(s, start) >= 0 for s in self.stops):
            return None
        return first_stop(self.decode(self._tokens[self.start :]), self.stops, include)


def first_stop(text: str, stops: tuple[str, ...], include: bool) -> int | None:
    """Where to cut `text` for the first of `stops` in it (after it if `include`), or None."""
    found = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    if not found:
        return None
    cut, first = min(found)
    return cut + len(first) if include else cut


def check_stop(
    token: int,
    generated: int,
    max_tokens: int,
    context: int,
    context_limit: int,
    eos_token_ids: frozenset[int],
    text: StopText | None = None,
    rules: StopRules | None = None,
) -> StopCheck:
    """Whether the request that just produced `token` (its `generated`-th) is done; `text` its output
    text read so far, for its stop strings.

    Nothing but the length ends a request before `min_tokens` (the stop strings
    are then looked for in the whole text once, and in the new text after);
    `ignore_eos` turns EOS into an ordinary token; a stop token ends it as EOS
    does.
    """
    rules = rules or StopRules()
    if generated >= rules.min_tokens:
        if (token in eos_token_ids and not rules.ignore_eos) or token in rules.stop_token_ids:
            return StopCheck(RequestStatus.FINISHED_STOPPED, on_token=True)
        if text is not None and (cut := text.first_stop(rules.include_stop)) is not None:
            return StopCheck(RequestStatus.FINISHED_STOPPED, cut)
    if generated >= max_tokens or context >= context_limit:
        return StopCheck(RequestStatus.FINISHED_LENGTH)
    return GOING


GOING = StopCheck(None)  # not finished: one shared value (asked of every token)


def stop_rules(params) -> StopRules:
    """A request's stop rules (`params` a SamplingParams)."""
    return StopRules(params.stop, frozenset(params.stop_token_ids), params.ignore_eos, params.min_tokens,
                     params.include_stop_str_in_output)
