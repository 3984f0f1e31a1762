"""Where a JSON value ends in a text that may still be growing: a scanner, not a parser.

`value_end(text, i)` is the index just past the value starting at `i`, None
while the text ends inside it, or -1 when the text there is no JSON value.
A value that has not ended yet holds every character after its start, which
is what lets a call's arguments stream as the model writes them.
"""

from __future__ import annotations

WS = " \t\r\n"
_SCALAR_END = WS + ",]}"
_CLOSE = {"{": "}", "[": "]"}


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """Past the closing quote of the string opening at `i` (text[i] == '"'), or None."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def value_end(text: str, i: int) -> int | None:
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in _CLOSE:
        return _container_end(text, i)
    if c in "-0123456789tfn":
        j = i
        while j < len(text) and text[j] not in _SCALAR_END:
            j += 1
        return j if j < len(text) else None
    return -1


def _container_end(text: str, i: int) -> int | None:
    stack = [_CLOSE[text[i]]]
    i += 1
    while i < len(text):
        c = text[i]
        if c == '"':
            end = string_end(text, i)
            if end is None:
                return None
            i = end
            continue
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c in "]}":
            if c != stack.pop():
                return -1
            if not stack:
                return i + 1
        i += 1
    return None
