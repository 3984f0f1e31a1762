"""The call syntaxes of the model families fsched knows, by name.

A family finds where its calls start in a text (`start`), and reads the calls
from there (`calls`), as far as the text goes. Adding a family is adding one
`Family` to `FAMILIES`: its name (what `fsched serve --tool-call-parser`
takes), the markers a streamed text must not show before they are complete,
these two functions, and what in a chat template shows a model of the family
(`family_of_template`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fsched.core.openai.toolcalls.calls import Call, read_call
from fsched.core.openai.toolcalls.jsonscan import skip_ws, value_end

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
PYTHON_TAG = "<|python_tag|>"


@dataclass(slots=True, frozen=True)
class Family:
    name: str
    markers: tuple[str, ...]  # held back from a stream until they are complete
    start: Callable[[str], int | None]  # where the calls start (None: no call, or not yet known)
    calls: Callable[[str, int], list[Call]]  # the calls from there, the last possibly open
    note: str  # the format, for the docs
    template_marks: tuple[str, ...] = ()  # any of these in a chat template: a model of this family
    # The family's tokenizers make its marker a special token, which the default decoding
    # (skip_special_tokens) drops from the text: its answers are decoded with special tokens kept
    # unless the request says otherwise (as vLLM's parser for the family asks too).
    keeps_special_tokens: bool = False


def _hermes_start(text: str) -> int | None:
    k = text.find(HERMES_OPEN)
    return None if k < 0 else k


def _hermes_calls(text: str, i: int) -> list[Call]:
    """`<tool_call>{json}</tool_call>`, one block a call, blocks one after another."""
    out: list[Call] = []
    while text.startswith(HERMES_OPEN, i):
        call = read_call(text, skip_ws(text, i + len(HERMES_OPEN)))
        if call is None:
            break
        out.append(call)
        if not call.done:
            break
        i = skip_ws(text, call.end)
        if text.startswith(HERMES_CLOSE, i):
            i = skip_ws(text, i + len(HERMES_CLOSE))
    return out


def _llama_start(text: str) -> int | None:
    """Llama 3.x's JSON form: the answer is `{"name": ..., "parameters": {...}}` (after an optional
    <|python_tag|>), several separated by ';'."""
    start = skip_ws(text, 0)
    i = _past_tag(text, start)
    if not text.startswith("{", i):
        return None
    rest = text[skip_ws(text, i + 1):]
    return start if rest.startswith('"name"') else None


def _past_tag(text: str, i: int) -> int:
    return skip_ws(text, i + len(PYTHON_TAG)) if text.startswith(PYTHON_TAG, i) else i


def llama_may_start(text: str) -> bool:
    """Whether a streamed text may still become a Llama JSON call (so it is held back)."""
    s = text.lstrip()
    s = s[len(PYTHON_TAG):].lstrip() if s.startswith(PYTHON_TAG) else s
    if PYTHON_TAG.startswith(s):
        return True
    if not s.startswith("{"):
        return False
    rest = s[1:].lstrip()
    return '"name"'.startswith(rest) or rest.startswith('"name"')


def _llama_calls(text: str, i: int) -> list[Call]:
    return _separated_calls(text, _past_tag(text, i), ";")


def array_calls(text: str, i: int) -> list[Call]:
    """A JSON array of call objects: Mistral's after [TOOL_CALLS], and a forced call's whole text."""
    i = skip_ws(text, i)
    return _separated_calls(text, i + 1, ",") if text.startswith("[", i) else []


def _separated_calls(text: str, i: int, separator: str) -> list[Call]:
    """Call objects from `i` on, one after another with `separator` between them, up to the first
    that is unfinished or not followed by the separator."""
    out: list[Call] = []
    while True:
        call = read_call(text, skip_ws(text, i))
        if call is None:
            return out
        out.append(call)
        if not call.done:
            return out
        i = skip_ws(text, call.end)
        if not text.startswith(separator, i):
            return out
        i += len(separator)


def _mistral_start(text: str) -> int | None:
    k = text.find(MISTRAL_MARK)
    return None if k < 0 else k


def _mistral_calls(text: str, i: int) -> list[Call]:
    """`[TOOL_CALLS][{"name", "arguments"}, ...]`, or the newer `[TOOL_CALLS]name[ARGS]{...}` a call."""
    j = skip_ws(text, i + len(MISTRAL_MARK))
    if text.startswith("[", j):
        return array_calls(text, j)
    out: list[Call] = []
    while text.startswith(MISTRAL_MARK, i):
        i += len(MISTRAL_MARK)
        k = text.find(MISTRAL_ARGS, i)
        if k < 0:
            return out
        name = text[i:k].strip()
        start = skip_ws(text, k + len(MISTRAL_ARGS))
        end = value_end(text, start)
        if not name or end == -1 or not text.startswith("{", start):
            return out
        out.append(Call(name, text[start:end] if end else text[start:], end))
        if end is None:
            return out
        i = skip_ws(text, end)
    return out


def _forced_start(text: str) -> int | None:
    i = skip_ws(text, 0)
    return i if text.startswith("[", i) else None


HERMES = Family("hermes", (HERMES_OPEN,), _hermes_start, _hermes_calls,
                "`<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>`, one block a call "
                "(Hermes, Qwen 2.5 and 3)", (HERMES_OPEN,))
LLAMA3_JSON = Family("llama3_json", (PYTHON_TAG,), _llama_start, _llama_calls,
                     "the answer is `{\"name\": ..., \"parameters\": {...}}`, several separated by `;` "
                     "(Llama 3.1 to 3.3)", (PYTHON_TAG, "<|start_header_id|>ipython"))
MISTRAL = Family("mistral", (MISTRAL_MARK,), _mistral_start, _mistral_calls,
                 "`[TOOL_CALLS]` then a JSON array of `{\"name\", \"arguments\"}`, or "
                 "`[TOOL_CALLS]name[ARGS]{...}` a call (Mistral)", (MISTRAL_MARK,), keeps_special_tokens=True)
FORCED = Family("forced", (), _forced_start, array_calls,
                "a JSON array of `{\"name\", \"arguments\"}`: what a required or named call is held to")

FAMILIES = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL)}
AUTO = "auto"
PARSER_NAMES = (AUTO, *FAMILIES)


def family_of_template(templates: list[str]) -> str | None:
    """The family whose marks a model's chat templates carry, when exactly one family's do; else None
    (no tools in the template, or marks of several: left to `auto`)."""
    found = {f.name for f in FAMILIES.values() for t in templates if any(m in t for m in f.template_marks)}
    return found.pop() if len(found) == 1 else None
