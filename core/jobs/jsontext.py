"""JSON text for any str, lone surrogates included: what output lines and API bodies are written with.

`json.dumps(..., ensure_ascii=False)` keeps a lone surrogate (U+D800..U+DFFF)
as it is, and the UTF-8 encoder then refuses it. JSON writes such a character
as a `\\udXXX` escape, which every JSON reader turns back into the same
character: so do we, and only for those (other text stays unescaped UTF-8).
"""

from __future__ import annotations

import json
import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(obj, separators: tuple[str, str] | None = None) -> str:
    """`json.dumps(obj, ensure_ascii=False)`, with lone surrogates escaped."""
    text = json.dumps(obj, ensure_ascii=False, separators=separators)
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
