"""A model folder's own response template, read by transformers' parser (`ResponseParser`).

`template_events(spec)` loads the template once (transformers checks it:
unknown keys, bad patterns, no start anchor are a ValueError) and gives the
function core/openai/toolcalls/template.py reads answers with: the region
events (open, chunk, close) of a text so far, or of a whole answer.
"""

from __future__ import annotations

from collections.abc import Callable


def template_events(spec: dict, reasoning: tuple[str, ...]) -> Callable[[str, bool, bool], list[dict]]:
    """`events(text, final, thinking)`: the template's region events for `text`. `thinking`: the
    prompt opened the reasoning region (the first of the fields named `reasoning` the template has:
    the parser is given its opening marker as its prefix). A region whose content does not parse (a
    call's broken JSON) is a ValueError."""
    from transformers.utils.chat_parsing import ResponseParser
    from transformers.utils.chat_parsing.response_templates import load_response_template

    loaded = load_response_template(spec)
    opened = _opening(loaded, reasoning)

    def events(text: str, final: bool, thinking: bool) -> list[dict]:
        stream = ResponseParser(loaded, prefix=opened if thinking else "")
        out = stream.initial_events + stream.feed(text)
        return out + stream.finalize()[1] if final else out

    return events


def _opening(loaded, names: tuple[str, ...]) -> str:
    for name in names:
        field = loaded.fields.get(name)
        if field is not None and field.open_literals:
            return field.open_literals[0]
    return ""
