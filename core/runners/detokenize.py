"""A request's output text as its tokens come, decoding only the new tokens and a short window before them.

Decoding the whole output on every step to find its new text costs in
proportion to the output's length (O(n^2) over an answer). This keeps the
offsets vLLM's detokenizer keeps: the text of the tokens read so far, and
where the window before the unread ones begins (a token's text can depend on
its neighbours, and a character split over tokens is held back until it is
whole). The text it returns is what decoding the whole sequence returns;
where a window's text does not extend the text before it the way a whole
decoding would (a decoder that rewrites earlier text), it decodes the whole
sequence instead.

A decode that can stream (it has a `stream()` giving a sequence's step
function, as a fast tokenizer's backend decode does: core/runners/hf/
decoding.py) is fed the new tokens instead: one call into the tokenizer's
library a step (several tokens that come together in one call) instead of
two decodes and their lists, about a third less CPU a streamed token
(bench/detokenize_path.py). It settles text exactly when the window above
would; while the newest tokens end in a partial character (it then settles
nothing), the window decodes them to return what the whole decoding would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]
# A sequence's incremental decoder: the next token (or a list of the next ones) in, the text it settled
# out (None: nothing settled yet); it raises where a decoder rewrote text it had settled.
Step = Callable[[int | list[int]], "str | None"]
UNFINISHED = "\ufffd"  # what a decoder makes of a character whose bytes have not all come


def stream_of(decode: Decode) -> Step | None:
    """A new sequence's step function where `decode` can stream, else None."""
    stream = getattr(decode, "stream", None)
    return stream() if stream is not None else None


def fed(step: Step, new: Sequence[int]) -> str | None:
    """`step` given the new tokens: one alone as itself, several in one list (one decode, not one each:
    a finished request's whole output, a chunk); the text they settled. Raises as `step` does."""
    return step(new[0] if len(new) == 1 else list(new))


class Detokenizer:
    """One growing token sequence's text: `text(tokens)` equals `decode(tokens)`; a sequence that is
    not the last one read grown (shorter, or other tokens in the window) is decoded whole."""

    __slots__ = ("decode", "_settled", "_prefix", "_read", "_window", "_window_text", "_stream", "_fed")

    def __init__(self, decode: Decode) -> None:
        self.decode = decode
        self._from_start()
        self._stream = stream_of(decode)
        self._fed: list[int] = []  # with a stream: tokens[_prefix:] as far as it has them

    def _from_start(self) -> None:
        self._settled = ""  # the text of tokens[:_read], no partial character at its end
        self._prefix = 0  # tokens[_prefix:_read]: the window read again as context
        self._read = 0
        self._window: list[int] = []  # those tokens, to tell the sequence grew rather than changed
        self._window_text = ""  # decode(_window): the same until the window moves

    def text(self, tokens: Sequence[int]) -> str:
        """decode(tokens), reading only what came after the last call's tokens."""
        if self._stream is not None:
            return self._streamed(tokens)
        n = len(tokens)
        if n < self._read or list(tokens[self._prefix:self._read]) != self._window:
            return self.decode(list(tokens))
        if n == self._read:
            return self._settled
        before = self._window_text
        after = self.decode(list(tokens[self._prefix:]))
        if not after.startswith(before):
            return self.decode(list(tokens))
        tail = after[len(before):]
        if not tail or tail.endswith(UNFINISHED):
            return self._settled + tail
        self._settled += tail
        self._prefix, self._read = self._read, n
        self._window = list(tokens[self._prefix:n])
        self._window_text = self.decode(self._window)
        return self._settled

    def _streamed(self, tokens: Sequence[int]) -> str:
        """`text` through the library's incremental decoder: `_prefix` and `_read` move as the window's
        would (the stream settles all it was given, or nothing), and `_fed` holds what it was given past
        `_prefix`, to tell the sequence grew rather than changed."""
        prefix, given = self._prefix, self._fed
        n, upto = len(tokens), prefix + len(given)
        seen = tokens[prefix:upto]
        if n < upto or (seen if type(seen) is list else list(seen)) != given:
            return self.decode(list(tokens))
        if n == upto:
            return self._settled if upto == self._read else self._unsettled(tokens)
        new = tokens[upto:n]
        try:
            piece = fed(self._stream, new)
        except Exception:  # a decoder that rewrote earlier text: the window's way, from the start
            self._stream = None
            self._from_start()
            return self.text(tokens)
        given += new
        if piece is not None:
            self._settled += piece
            given = self._fed = given[self._read - self._prefix:]
            self._prefix, self._read = self._read, self._read + len(given)
        return self._settled if self._prefix + len(given) == self._read else self._unsettled(tokens)

    def _unsettled(self, tokens: Sequence[int]) -> str:
        """The settled text and what the tokens after it decode to so far (a partial character's
        replacement among it), as the window gives it."""
        before = self.decode(list(tokens[self._prefix:self._read]))
        after = self.decode(list(tokens[self._prefix:]))
        if not after.startswith(before):
            return self.decode(list(tokens))
        return self._settled + after[len(before):]
