"""Chat messages as a body gives them: roles, text content, a participant's name, tool calls, an
assistant's reasoning.

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

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal",
                          "reasoning_content"})
MAX_TOOL_CALLS = 128  # calls in one assistant message


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
        if message.get("refusal") is not None:
            raise InputError("an earlier refusal is not taken (null only): fsched's models give none",
                             f"{where}.refusal")
        calls = _tool_calls(message.get("tool_calls"), role, f"{where}.tool_calls")
        call_id = _tool_call_id(message.get("tool_call_id"), role, f"{where}.tool_call_id")
        reasoning = _reasoning(message.get("reasoning_content"), role, f"{where}.reasoning_content")
        content = message.get("content")
        text = "" if content is None and (calls or role == "assistant") else _content(content, where)
        name = storable(name, f"{where}.name") if name else None
        out.append(ChatMessage(role=role, content=text, name=name, tool_calls=calls, tool_call_id=call_id,
                               reasoning_content=reasoning))
    return tuple(out)


def _tool_calls(value: Any, role: str, where: str) -> tuple[dict, ...]:
    """An assistant's earlier calls: [{id, type: "function", function: {name, arguments}}]."""
    if value is None:
        return ()
    if role != "assistant":
        raise InputError("only an assistant message carries tool calls", where)
    if not isinstance(value, list) or len(value) > MAX_TOOL_CALLS:
        raise InputError(f"must be an array of at most {MAX_TOOL_CALLS} tool calls", where)
    out = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise InputError('must be {"id", "type": "function", "function": {"name", "arguments"}}', at)
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise InputError("must be a non-empty string", f"{at}.function.name")
        if not isinstance(arguments, str):
            raise InputError("must be a string (the arguments as JSON text)", f"{at}.function.arguments")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise InputError("must be a string", f"{at}.id")
        out.append({"id": storable(call_id or f"call_{i}", f"{at}.id"), "type": "function",
                    "function": {"name": storable(name, f"{at}.function.name"),
                                 "arguments": storable(arguments, f"{at}.function.arguments")}})
    return tuple(out)


def _tool_call_id(value: Any, role: str, where: str) -> str | None:
    return _text_of_role(value, role, "tool", "only a tool message answers a call", where)


def _reasoning(value: Any, role: str, where: str) -> str | None:
    """An assistant's earlier reasoning, as an answer gave it back (`reasoning_content`): handed to the
    template, which keeps or drops it (Qwen 3's keeps the turns after the last question's)."""
    return _text_of_role(value, role, "assistant", "only an assistant message carries reasoning", where)


def _text_of_role(value: Any, role: str, owner: str, refusal: str, where: str) -> str | None:
    """A string field only `owner`'s messages may carry (None when absent)."""
    if value is None:
        return None
    if role != owner:
        raise InputError(refusal, where)
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {json_type(value)}", where)
    return storable(value, where)


def _message_key_problem(key: str) -> str:
    if key == "function_call":
        return "the deprecated function_call is not taken: send tool_calls"
    if key == "audio":
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

