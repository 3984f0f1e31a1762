"""Text that any column takes back exactly: NUL and lone surrogates included.

A model's output is whatever its tokens decode to: a byte-level tokenizer has
a token for 0x00, and decoding bytes that are not UTF-8 with
`surrogateescape` gives lone surrogates (U+DC80..U+DCFF). PostgreSQL's text
refuses NUL ("text fields cannot contain NUL (0x00) bytes"); neither driver
can encode a lone surrogate to UTF-8. So the text columns that hold what a
client or a model wrote store it through this codec:

- text without NUL, surrogates or the escape character at its start is
  stored as it is (the common case: one scan, no copy);
- any other text is stored as ESCAPE followed by the text, in which every
  NUL, surrogate and ESCAPE is written ESCAPE + four hex digits of its code
  point. A stored value that starts with ESCAPE is always such a form, so
  decoding is exact.

ESCAPE is U+FDD0, a Unicode noncharacter: valid UTF-8 that both backends store,
and that no tokenizer's text holds in practice (when it does, it is escaped too).
"""

from __future__ import annotations

import re

from sqlalchemy import String, Text
from sqlalchemy.types import TypeDecorator

ESCAPE = "\ufdd0"
_UNSAFE = re.compile("[\x00\ud800-\udfff\ufdd0]")
_ESCAPED = re.compile("\ufdd0([0-9a-f]{4})")


def encode_text(text: str) -> str:
    """The form a column stores (the text itself when it is safe)."""
    if not text.startswith(ESCAPE) and _UNSAFE.search(text) is None:
        return text
    return ESCAPE + _UNSAFE.sub(lambda m: f"{ESCAPE}{ord(m.group()):04x}", text)


def decode_text(stored: str) -> str:
    """The text `encode_text` was given."""
    if not stored.startswith(ESCAPE):
        return stored
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), stored[1:])


class SafeText(TypeDecorator):
    """A TEXT column whose values go through the codec both ways."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else encode_text(value)

    def process_result_value(self, value, dialect):
        return None if value is None else decode_text(value)


class SafeString(TypeDecorator):
    """A VARCHAR(n) column whose values go through the codec both ways."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else encode_text(value)

    def process_result_value(self, value, dialect):
        return None if value is None else decode_text(value)
