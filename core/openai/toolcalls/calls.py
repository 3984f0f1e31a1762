"""One call object as a family writes it: `{"name": ..., "arguments": {...}}`, read as far as it goes.

`read_call(text, i)` reads the object opening at `i`: its name once the name's
string has ended, its arguments' raw JSON text so far (the text itself, not a
re-serialisation, so the streamed fragments join into exactly the whole
answer's arguments), and whether the object has ended. None: no call there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fsched.core.openai.toolcalls.jsonscan import skip_ws, string_end, value_end

NAME_KEYS = ("name",)
ARGUMENT_KEYS = ("arguments", "parameters")  # Llama 3.x writes "parameters"


@dataclass(slots=True, frozen=True)
class Call:
    name: str | None  # None while its string is still being written
    arguments: str  # raw JSON text so far ("{}" for a finished call without arguments)
    end: int | None = None  # past the object's closing brace; None while it is open

    @property
    def done(self) -> bool:
        return self.end is not None


def read_call(text: str, i: int) -> Call | None:
    if i >= len(text) or text[i] != "{":
        return None
    name, args, args_string, i = None, None, False, i + 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return _open(name, args, args_string)
        if text[i] == "}":
            if name is None:
                return None
            return Call(name, _finished_args(args, args_string), i + 1)
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            return None
        key_end = string_end(text, i)
        if key_end is None:
            return _open(name, args, args_string)
        key = json.loads(text[i:key_end])
        i = skip_ws(text, key_end)
        if i >= len(text):
            return _open(name, args, args_string)
        if text[i] != ":":
            return None
        start = skip_ws(text, i + 1)
        end = value_end(text, start)
        if end == -1:
            return None
        if key in ARGUMENT_KEYS:
            args, args_string = text[start:end] if end else text[start:], text[start:start + 1] == '"'
        if end is None:
            return _open(name, args, args_string)
        if key in NAME_KEYS:
            name = json.loads(text[start:end])
            if not isinstance(name, str) or not name:
                return None
        i = end


def _open(name: str | None, args: str | None, args_string: bool) -> Call:
    """A call still being written: arguments shown once the name is known (OpenAI sends the
    name first); arguments written as a JSON string wait for their end."""
    if name is None or args is None or args_string:
        return Call(name, "")
    return Call(name, args)


def _finished_args(args: str | None, args_string: bool) -> str:
    if args is None:
        return "{}"
    if args_string:
        return json.loads(args) if isinstance(json.loads(args), str) else args
    return args
