"""The body values with a shape of their own: prompts, messages, response formats, stream options.

Checked as `values.Custom` kinds of the field table (`fields.py`); each
returns the value as fsched keeps it or raises `BadValue` with the path
inside the value that is wrong.
"""

from __future__ import annotations

from typing import Any

from fsched.core.jobs.limits import InputLimits
from fsched.core.jobs.values import BadValue, json_type, storable
from fsched.core.types import ChatMessage

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
MESSAGE_KEYS = frozenset({"role", "content", "name"})
MAX_PROMPTS = 128  # prompts in one completions body (OpenAI's bound on n)
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def prompts(value: Any, limits: InputLimits) -> tuple[str, ...]:
    """A completions prompt: a string, or an array of strings (one answer each)."""
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list) or not value:
        raise BadValue(f"must be a string or a non-empty array of strings, got {json_type(value)}")
    if len(value) > MAX_PROMPTS:
        raise BadValue(f"at most {MAX_PROMPTS} prompts in one request")
    out = []
    for i, prompt in enumerate(value):
        where = f"[{i}]" if len(value) > 1 or not isinstance(prompt, str) else ""
        if isinstance(prompt, int | list) and not isinstance(prompt, bool):
            raise BadValue("a prompt of token ids is not taken: send the text (the daemon encodes it "
                           "with the model's own tokenizer)", where)
        if not isinstance(prompt, str):
            raise BadValue(f"must be a string, got {json_type(prompt)}", where)
        if not prompt:
            raise BadValue("must not be empty", where)
        out.append(storable(prompt, where))
    return tuple(out)


def messages(value: Any, limits: InputLimits) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise BadValue("must be a non-empty array of {role, content} objects")
    out = []
    for i, message in enumerate(value):
        where = f"[{i}]"
        if not isinstance(message, dict):
            raise BadValue(f"must be an object, got {json_type(message)}", where)
        for key in message:
            if key not in MESSAGE_KEYS:
                raise BadValue(_message_key_problem(key), f"{where}.{key}")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise BadValue(f"must be one of {', '.join(sorted(CHAT_ROLES))}", f"{where}.role")
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise BadValue(f"must be a string, got {json_type(name)}", f"{where}.name")
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
                raise BadValue('only {"type": "text", "text": ...} parts', f"{where}.content[{j}]")
            parts.append(storable(part["text"], f"{where}.content[{j}].text"))
        return "".join(parts)
    raise BadValue("must be a string or a list of text parts", f"{where}.content")


def stream_options(value: Any, limits: InputLimits) -> dict[str, bool]:
    """OpenAI's {include_usage, include_obfuscation} and vLLM's continuous_usage_stats."""
    if not isinstance(value, dict):
        raise BadValue(f"must be an object, got {json_type(value)}")
    known = ("include_usage", "include_obfuscation", "continuous_usage_stats")
    out = {}
    for key, flag in value.items():
        if key not in known:
            raise BadValue(f"unknown stream option (accepted: {', '.join(known)})", f".{key}")
        if flag is None:
            continue
        if not isinstance(flag, bool):
            raise BadValue(f"must be a boolean, got {json_type(flag)}", f".{key}")
        out[key] = flag
    return out


def response_format(value: Any, limits: InputLimits) -> dict:
    """{"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema, strict}}."""
    if not isinstance(value, dict):
        raise BadValue(f"must be an object, got {json_type(value)}")
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise BadValue(f"must be one of {', '.join(RESPONSE_FORMATS)}", ".type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise BadValue("unknown field of a response format", f".{sorted(extra)[0]}")
    if kind != "json_schema":
        if "json_schema" in value:
            raise BadValue(f"only with type json_schema, not {kind}", ".json_schema")
        return {"type": kind}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise BadValue("must be an object {name, schema, strict, description}", ".json_schema")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise BadValue("unknown field of json_schema", f".json_schema.{sorted(unknown)[0]}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise BadValue("must be a non-empty string", ".json_schema.name")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise BadValue(f"must be a JSON schema object, got {json_type(schema)}", ".json_schema.schema")
    return {"type": kind, "json_schema": {"name": name, "schema": schema,
                                          "strict": bool(spec.get("strict"))}}
