"""Answers read through a model's own response template (a tokenizer's `response_template`).

transformers 5.x reads a tokenizer's `response_template` (a declarative spec of
an answer's regions: reasoning, content, tool calls, with their open and close
anchors and how each is parsed) with `parse_response`, and while it streams
with `ResponseParser`, which holds back whatever may still become an anchor
(core/runners/hf/response_template.py wraps it: transformers stays on the
runner's side). A served model whose folder carries one is read by it instead
of a known family's syntax: `register` gives the template a name (its content's hash)
that requests store as their parser, so every reader in the process that
registered it (streams, resumed streams, a batch's results) reads alike; a
process without it reads such a request as `auto` does.

`read_template` is applied, as `reading.read` is, to the whole text so far at
every update: it re-parses that text and reports the regions closed so far,
and the one still open as far as it goes (text regions only: a call is shown
once its region has closed, whole, so its arguments are never partial JSON).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from fsched.core.openai.toolcalls.calls import Call

PREFIX = "template:"
CONTENT, CALLS = "content", "tool_calls"
REASONING = ("reasoning_content", "reasoning", "thinking")  # the names templates give the reasoning

Events = Callable[[str, bool, bool], list[dict]]  # (text, final, thinking) -> the template's region events
_templates: dict[str, Events] = {}  # name -> its events (core/runners/hf/response_template.py)


def is_template(parser: str) -> bool:
    return parser.startswith(PREFIX)


def known(parser: str) -> bool:
    return parser in _templates


def register(spec: dict, events: Events) -> str:
    """The name requests store to be read by `spec` (whose `events` the runner's side loaded) in this
    process."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    name = PREFIX + digest
    _templates[name] = events
    return name


def read_template(parser: str, text: str, final: bool, tools: bool, thinking: bool
                  ) -> tuple[str | None, str, tuple[Call, ...]]:
    """(reasoning, content, calls) of `text` as the registered template reads it. `thinking`: the
    prompt opened the reasoning region. Calls are read only where tools were offered; text the
    template cannot parse (a call's JSON broken) is content, whole, at the end, and held back until
    then."""
    try:
        events = _templates[parser](text, final, thinking)
    except ValueError:
        return None, (text.strip() if final else ""), ()
    return _regions(events, tools, len(text))


def _regions(events: list[dict], tools: bool, end: int) -> tuple[str | None, str, tuple[Call, ...]]:
    closed: dict[str, list] = {}
    open_name, open_text = None, ""
    for event in events:
        kind, name = event["type"], event["field"]
        if kind == "region_open":
            open_name, open_text = name, ""
        elif kind == "region_chunk":
            open_text += event["text"]
        else:
            value = event["value"]
            values = value if isinstance(value, list) and name == CALLS else [value]
            closed.setdefault(name, []).extend(values)
            open_name, open_text = None, ""
    reasoning = _text(closed, open_name, open_text, REASONING)
    content = _text(closed, open_name, open_text, (CONTENT,)) or ""
    calls = tuple(c for v in closed.get(CALLS, ()) if (c := _call(v, end)) is not None) if tools else ()
    return reasoning, content, calls


def _text(closed: dict[str, list], open_name: str | None, open_text: str, names: tuple[str, ...]
          ) -> str | None:
    """A text region's value: the regions of that name closed so far, joined (a template closes its
    content again after each call), then the open one's text (stripped, as the text parser strips)."""
    parts = [v for n in names for v in closed.get(n, ()) if isinstance(v, str) and v]
    if open_name in names and open_text.strip():
        parts.append(open_text.strip())
    if not parts and not any(n in closed or n == open_name for n in names):
        return None
    return "\n".join(parts)


def _call(value: Any, end: int) -> Call | None:
    """One call region's value: `{"type": "function", "function": {"name", "arguments"}}` or the
    function object alone; arguments as JSON text (an object serialised, a string kept)."""
    if not isinstance(value, dict):
        return None
    function = value.get("function", value)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    arguments = function.get("arguments", function.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return Call(function["name"], arguments, end)
