"""Chat messages as a body gives them: roles, text content, a participant's name.

`messages` is the field table's check of chat's `messages` (and of
/tokenize's): it returns the conversation as fsched keeps it (`ChatMessage`,
what the model's chat template is given) or raises `InputError` with the path
inside the array that is wrong. A message's key fsched does not take is
refused by name, with the reason.
"""

from __future__ import annotations

from typing import Any

from fsched.core.jobs.inputs import InputError, json_type, storable
from fsched.core.jobs.limits import InputLimits
from fsched.core.types import ChatMessage

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
MESSAGE_KEYS = frozenset({"role", "content", "name"})


def messages(value: Any, limits: InputLimits) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise InputError("must be a non-empty array of {role, content} objects")
    out = []
    for i, message in enumerate(value):
        where = f"[{i}]"
        if not isinstance(message, dict):
            raise InputError(f"must be an object, got {json_type(message)}", where)
        for key in message:
            if key not in MESSAGE_KEYS:
                raise InputError(_message_key_problem(key), f"{where}.{key}")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InputError(f"must be one of {', '.join(sorted(CHAT_ROLES))}", f"{where}.role")
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise InputError(f"must be a string, got {json_type(name)}", f"{where}.name")
        out.append(ChatMessage(role=role, content=_content(message.get("content"), where),
                               name=storable(name, f"{where}.name") if name else None))
    return tuple(out)


def _message_key_problem(key: str) -> str:
    if key in ("tool_calls", "tool_call_id", "function_call"):
        return "tool calls are not taken (fsched refuses tools; see docs/http.md)"
    if key in ("audio", "refusal"):
        return "not taken: fsched serves text models"
    return f"unknown field of a message (accepted: {', '.join(sorted(MESSAGE_KEYS))})"


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of {"type": "text"} parts."""
    if isinstance(value, str):
        return storable(value, f"{where}.content")
    if isinstance(value, list) and value:
        parts = []
        for j, part in enumerate(value):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise InputError('only {"type": "text", "text": ...} parts', f"{where}.content[{j}]")
            parts.append(storable(part["text"], f"{where}.content[{j}].text"))
        return "".join(parts)
    raise InputError("must be a string or a list of text parts", f"{where}.content")
