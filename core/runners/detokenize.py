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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]
UNFINISHED = "\ufffd"  # what a decoder makes of a character whose bytes have not all come


class Detokenizer:
    """One growing token sequence's text: `text(tokens)` equals `decode(tokens)`; a sequence that is
    not the last one read grown (shorter, or other tokens in the window) is decoded whole."""

    __slots__ = ("decode", "_settled", "_prefix", "_read", "_window", "_window_text")

    def __init__(self, decode: Decode) -> None:
        self.decode = decode
        self._settled = ""  # the text of tokens[:_read], no partial character at its end
        self._prefix = 0  # tokens[_prefix:_read]: the window read again as context
        self._read = 0
        self._window: list[int] = []  # those tokens, to tell the sequence grew rather than changed
        self._window_text = ""  # decode(_window): the same until the window moves

    def text(self, tokens: Sequence[int]) -> str:
        """decode(tokens), reading only what came after the last call's tokens."""
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
