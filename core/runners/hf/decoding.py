"""A fast tokenizer's own decode, which also streams: the `tokenizers` library's incremental decoder.

`BackendDecode(backend, skip_special_tokens)` decodes a list of ids as
`backend.decode` does (a `functools.partial`, called as fast as one), and
its `stream()` gives a new request's step function: the next token (or a
list of the next ones) in, the text it settled out (None while it settles
nothing, a partial character held back), raising where a decoder rewrote
text it had settled. That is `DecodeStream.step`: the prefix and read
offsets of vLLM's detokenizer, kept in Rust (tokenizers 0.21 and later;
with an older one `stream()` gives None and the caller decodes its own
window).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers before 0.21
    DecodeStream = None


class BackendDecode(partial):
    """`backend.decode(ids, skip_special_tokens=...)` of a `tokenizers` Tokenizer, and its streams."""

    def __new__(cls, backend, skip_special_tokens: bool):
        return super().__new__(cls, backend.decode, skip_special_tokens=skip_special_tokens)

    @property
    def skip_special_tokens(self) -> bool:
        return self.keywords["skip_special_tokens"]

    def stream(self) -> Callable[[int | list[int]], str | None] | None:
        """A new sequence's step function (None without the library's incremental decoder)."""
        if DecodeStream is None:
            return None
        return partial(DecodeStream(skip_special_tokens=self.skip_special_tokens).step, self.func.__self__)

    def __reduce__(self):
        return BackendDecode, (self.func.__self__, self.skip_special_tokens)
