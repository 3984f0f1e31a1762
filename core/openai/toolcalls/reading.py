"""A chat answer's text split into reasoning, content and tool calls: whole, or as far as it streamed.

`read(text, final, options)` is pure and applied to the whole text so far at
every update, so a streamed answer and a whole one are the same function of
the same text. While the text may still grow (`final` false), whatever could
yet turn into a marker (`<think>`, `<tool_call>`, the start of a Llama JSON
call) is held back from the content, so no call's text ever reaches it, and
each part only grows: the reasoning and content are prefixes of their later
values, each call's arguments a prefix of its final arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fsched.core.openai.toolcalls import template
from fsched.core.openai.toolcalls.calls import Call
from fsched.core.openai.toolcalls.families import AUTO, FAMILIES, FORCED, LLAMA3_JSON, Family, llama_may_start

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(slots=True, frozen=True)
class ReadOptions:
    tools: bool = False  # read tool calls (tools given, tool_choice not "none")
    forced: bool = False  # the grammar made the whole text a JSON array of calls
    parser: str = AUTO  # a family's name, AUTO (any known family's syntax), or a registered response template
    one_call: bool = False  # parallel_tool_calls false: calls after the first are not read
    thinking: bool = False  # the prompt left a reasoning block open: the text starts inside it


@dataclass(slots=True, frozen=True)
class Reading:
    reasoning: str | None  # None: the text has no reasoning part
    content: str
    calls: tuple[Call, ...] = ()

    def finished_calls(self) -> tuple[Call, ...]:
        return tuple(c for c in self.calls if c.done)


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a reasoning block, as templates that open `<think>` for
    the model do (the model then writes its reasoning, `</think>` and its answer); a prompt ending with
    a closed, empty block (reasoning switched off) does not."""
    return prompt.rstrip().endswith(THINK_OPEN)


def read(text: str, final: bool, options: ReadOptions = ReadOptions()) -> Reading:
    if not options.forced and template.is_template(options.parser):
        if template.known(options.parser):
            reading = Reading(*template.read_template(options.parser, text, final, options.tools,
                                                      options.thinking))
            return Reading(reading.reasoning, reading.content, reading.calls[:1]) \
                if options.one_call and len(reading.calls) > 1 else reading
        options = replace(options, parser=AUTO)  # a process without the template reads as `auto` does
    reasoning, rest = _opened_reasoning(text, final) if options.thinking else _reasoning(text, final)
    if not options.tools:
        return Reading(reasoning, rest)
    if options.forced:
        reading = Reading(reasoning, "", tuple(FORCED.calls(rest, 0)))
    else:
        families = list(FAMILIES.values()) if options.parser == AUTO else [FAMILIES[options.parser]]
        reading = _calls_and_content(rest, final, families, reasoning)
    if options.one_call and len(reading.calls) > 1:
        return Reading(reading.reasoning, reading.content, reading.calls[:1])
    return reading


def plain_from_here(text: str, options: ReadOptions) -> bool:
    """Whether `text`, and every text that starts with it, reads as content alone (no reasoning, no
    calls): no tools to read, no template or opened reasoning, and a start that is no `<think>` and
    cannot grow into one. A stream's reader then skips reading each later text."""
    if options.tools or options.forced or options.thinking or template.is_template(options.parser):
        return False
    stripped = text.lstrip()
    return bool(stripped) and not stripped.startswith(THINK_OPEN) and not THINK_OPEN.startswith(stripped)


def _reasoning(text: str, final: bool) -> tuple[str | None, str]:
    """Reasoning written as `<think>...</think>` at the start; the rest of the text."""
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        if not final and stripped and THINK_OPEN.startswith(stripped):
            return None, ""
        return None, text
    start = text.index(THINK_OPEN) + len(THINK_OPEN)
    end = text.find(THINK_CLOSE, start)
    if end < 0:
        return (text[start:] if final else _held(text[start:], (THINK_CLOSE,))), ""
    return text[start:end], text[end + len(THINK_CLOSE):].lstrip()


def _opened_reasoning(text: str, final: bool) -> tuple[str | None, str]:
    """The text of a prompt that opened the reasoning: reasoning up to `</think>`, the rest after it.
    A model that writes the opening tag again anyway is read as if the prompt had not."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return _reasoning(text, final)
    if not final and THINK_OPEN.startswith(stripped):
        return "", ""
    end = text.find(THINK_CLOSE)
    if end < 0:
        return (text if final else _held(text, (THINK_CLOSE,))), ""
    return text[:end], text[end + len(THINK_CLOSE):].lstrip()


def _calls_and_content(text: str, final: bool, families: list[Family], reasoning: str | None) -> Reading:
    found = [(k, f) for f in families if (k := f.start(text)) is not None]
    if found:
        k, family = min(found, key=lambda pair: pair[0])
        calls = family.calls(text, k)
        if calls or not final:
            return Reading(reasoning, text[:k].rstrip(), tuple(calls))
        return Reading(reasoning, text.rstrip())
    if final:
        return Reading(reasoning, text.rstrip())
    if LLAMA3_JSON in families and llama_may_start(text):
        return Reading(reasoning, "")
    markers = tuple(m for f in families for m in f.markers)
    return Reading(reasoning, _held(text, markers).rstrip())


def _held(text: str, markers: tuple[str, ...]) -> str:
    """`text` less any end of it that may be the start of a marker."""
    cut = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), cut, -1):
            if text.endswith(marker[:size]):
                cut = size
                break
    return text[:len(text) - cut]
