"""JSON text both ways: any input read by one set of rules, any str written (lone surrogates included).

Every JSON object fsched takes (a line of a file, a request body) is read by
`loads_object`: finite numbers, each key once, a bounded depth, no lone
surrogate. Output lines and API bodies are written with `dumps`:

`json.dumps(..., ensure_ascii=False)` keeps a lone surrogate (U+D800..U+DFFF)
as it is, and the UTF-8 encoder then refuses it. JSON writes such a character
as a `\\udXXX` escape, which every JSON reader turns back into the same
character: so do we, and only for those (other text stays unescaped UTF-8).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fsched.core.jobs.inputs import InputError, json_type

_SURROGATE = re.compile("[\ud800-\udfff]")


def _encoder(separators: tuple[str, str] | None) -> Callable[[Any], str]:
    return json.JSONEncoder(ensure_ascii=False, separators=separators).encode


# `json.dumps` with any argument makes an encoder at every call (a sixth of a small chunk's cost): the
# two every response uses are made once.
_ENCODERS = {None: _encoder(None), (",", ":"): _encoder((",", ":"))}


def dumps(obj, separators: tuple[str, str] | None = None) -> str:
    """`json.dumps(obj, ensure_ascii=False)`, with lone surrogates escaped."""
    text = (_ENCODERS.get(separators) or _encoder(separators))(obj)
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_encode_string = json.encoder.encode_basestring  # C: what `json.dumps(text, ensure_ascii=False)` writes


def string(text: str) -> str:
    """`dumps(text)` for a str, at a fraction of its cost (one C call, no encoder made): a stream's
    text delta is escaped with it at every token."""
    out = _encode_string(text)
    if text.isascii() or _SURROGATE.search(out) is None:
        return out
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", out)


def _reject_constant(name: str) -> Any:
    raise InputError(f"{name} is not valid JSON (numbers must be finite)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise InputError("duplicate key (a JSON object names each key once)", key)
            seen.add(key)
    return obj


# Made once: `json.loads` with hooks builds a decoder at every call (a few µs of every online request).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def loads_object(text: str, max_depth: int) -> dict:
    """One JSON object by fsched's rules for any input (finite numbers, unique keys, bounded depth,
    no lone surrogate), or InputError (naming the offending key when known)."""
    if text.startswith("\ufeff"):  # as `json.loads` refuses it
        raise InputError("invalid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (column 1)")
    try:
        obj = _DECODER.decode(text)
    except InputError:  # a key twice or a constant such as NaN, named by the hooks
        raise
    except RecursionError:
        raise InputError(f"JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise InputError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InputError(f"each line must be a JSON object, got {json_type(obj)}")
    # Every container opens with a bracket of the text: with no more brackets than the bound (any body
    # but a long conversation's) it cannot be nested deeper, and the walk is not needed.
    if text.count("{") + text.count("[") > max_depth and _depth(obj) > max_depth:
        raise InputError(f"JSON nested deeper than {max_depth} levels")
    if _SURROGATE_ESCAPE.search(text):
        _no_lone_surrogate(obj)
    return obj


# A lone UTF-16 surrogate reaches a string only through a \uD800-\uDFFF escape (UTF-8 text cannot
# hold one); pairs decode to one character, so only such text needs the walk.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogate(obj: Any) -> None:
    """Refuse any key or string holding a lone surrogate: no database column, tokenizer or JSON
    encoder takes one, so it would fail wherever it went next."""
    stack = [(None, obj)]
    while stack:
        top, node = stack.pop()
        pairs = node.items() if isinstance(node, dict) else ((None, v) for v in node)
        for key, value in pairs:
            field = top or key
            for text in (key, value):
                bad = _LONE.search(text) if isinstance(text, str) else None
                if bad is not None:
                    raise InputError(f"holds a lone surrogate \\u{ord(bad.group()):04x} (not valid Unicode: "
                                     "a UTF-16 surrogate must come in a pair)", field)
            if isinstance(value, dict | list):
                stack.append((field, value))


def _depth(obj: Any) -> int:
    """Nesting depth of containers, iteratively (no recursion to exhaust)."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return deepest
