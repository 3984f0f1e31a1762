"""The body values with a shape of their own: prompts, response formats, stream options.

Checked as `values.Custom` kinds of the field table (`fields.py`); each
returns the value as fsched keeps it or raises `InputError` with the path
inside the value that is wrong. Chat messages have a module of their own
(`messages.py`).
"""

from __future__ import annotations

from typing import Any

from fsched.core.jobs.inputs import InputError, json_type, storable
from fsched.core.jobs.limits import InputLimits

MAX_PROMPTS = 128  # prompts in one completions body (OpenAI's bound on n)
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def prompts(value: Any, limits: InputLimits) -> tuple[str, ...]:
    """A completions prompt: a string, or an array of strings (one answer each)."""
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list) or not value:
        raise InputError(f"must be a string or a non-empty array of strings, got {json_type(value)}")
    if len(value) > MAX_PROMPTS:
        raise InputError(f"at most {MAX_PROMPTS} prompts in one request")
    out = []
    for i, prompt in enumerate(value):
        where = f"[{i}]" if len(value) > 1 or not isinstance(prompt, str) else ""
        if isinstance(prompt, int | list) and not isinstance(prompt, bool):
            raise InputError("a prompt of token ids is not taken: send the text (the daemon encodes it "
                           "with the model's own tokenizer)", where)
        if not isinstance(prompt, str):
            raise InputError(f"must be a string, got {json_type(prompt)}", where)
        if not prompt:
            raise InputError("must not be empty", where)
        out.append(storable(prompt, where))
    return tuple(out)


def stream_options(value: Any, limits: InputLimits) -> dict[str, bool]:
    """OpenAI's {include_usage, include_obfuscation} and vLLM's continuous_usage_stats."""
    if not isinstance(value, dict):
        raise InputError(f"must be an object, got {json_type(value)}")
    known = ("include_usage", "include_obfuscation", "continuous_usage_stats")
    out = {}
    for key, flag in value.items():
        if key not in known:
            raise InputError(f"unknown stream option (accepted: {', '.join(known)})", f".{key}")
        if flag is None:
            continue
        if not isinstance(flag, bool):
            raise InputError(f"must be a boolean, got {json_type(flag)}", f".{key}")
        out[key] = flag
    return out


def response_format(value: Any, limits: InputLimits) -> dict:
    """{"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema, strict}}."""
    if not isinstance(value, dict):
        raise InputError(f"must be an object, got {json_type(value)}")
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise InputError(f"must be one of {', '.join(RESPONSE_FORMATS)}", ".type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise InputError("unknown field of a response format", f".{sorted(extra)[0]}")
    if kind != "json_schema":
        if "json_schema" in value:
            raise InputError(f"only with type json_schema, not {kind}", ".json_schema")
        return {"type": kind}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InputError("must be an object {name, schema, strict, description}", ".json_schema")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise InputError("unknown field of json_schema", f".json_schema.{sorted(unknown)[0]}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("must be a non-empty string", ".json_schema.name")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InputError(f"must be a JSON schema object, got {json_type(schema)}", ".json_schema.schema")
    return {"type": kind, "json_schema": {"name": name, "schema": schema,
                                          "strict": bool(spec.get("strict"))}}


MAX_TOOLS = 128  # functions in one request (OpenAI's bound)
TOOL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def tools(value: Any, limits: InputLimits) -> tuple[dict, ...]:
    """Function tools: [{"type": "function", "function": {name, description, parameters, strict}}]."""
    if not isinstance(value, list):
        raise InputError(f"must be an array of tools, got {json_type(value)}")
    if len(value) > MAX_TOOLS:
        raise InputError(f"at most {MAX_TOOLS} tools")
    out, names = [], set()
    for i, tool in enumerate(value):
        where = f"[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InputError('only function tools ({"type": "function", "function": {...}})', where)
        if set(tool) - {"type", "function"}:
            extra = sorted(set(tool) - {"type", "function"})[0]
            raise InputError("unknown field of a tool", f"{where}.{extra}")
        function = _function(tool.get("function"), f"{where}.function")
        if function["name"] in names:
            raise InputError("two tools of one name", f"{where}.function.name")
        names.add(function["name"])
        out.append({"type": "function", "function": function})
    return tuple(out)


def _function(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise InputError("must be an object {name, description, parameters, strict}", where)
    unknown = set(value) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise InputError("unknown field of a function", f"{where}.{sorted(unknown)[0]}")
    name = value.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 64 or not set(name) <= TOOL_NAME_CHARS:
        raise InputError("must be 1 to 64 letters, digits, '_', '-' or '.'", f"{where}.name")
    out: dict = {"name": name}
    if value.get("description") is not None:
        if not isinstance(value["description"], str):
            raise InputError("must be a string", f"{where}.description")
        out["description"] = storable(value["description"], f"{where}.description")
    parameters = value.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise InputError(f"must be a JSON schema object, got {json_type(parameters)}",
                             f"{where}.parameters")
        out["parameters"] = parameters
    if value.get("strict") is not None:
        if not isinstance(value["strict"], bool):
            raise InputError("must be a boolean", f"{where}.strict")
        out["strict"] = value["strict"]
    return out


def tool_choice(value: Any, limits: InputLimits) -> str | dict:
    """"none", "auto", "required", or {"type": "function", "function": {"name": ...}}."""
    if value in ("none", "auto", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(function, dict) or value.get("type") != "function" or not isinstance(
            function.get("name"), str):
        raise InputError('must be "none", "auto", "required" or {"type": "function", "function": {"name"}}')
    return {"type": "function", "function": {"name": function["name"]}}


def template_kwargs(value: Any, limits: InputLimits) -> dict:
    """chat_template_kwargs: any JSON object (the parser already bounds its size and depth)."""
    if not isinstance(value, dict):
        raise InputError(f"must be an object, got {json_type(value)}")
    for key in value:
        if key in RESERVED_TEMPLATE_NAMES:
            raise InputError("set by fsched itself (the request's own fields give it)", f".{key}")
    return value


# What fsched hands the template itself: a request may not replace them through chat_template_kwargs.
RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                     "continue_final_message", "tokenize", "chat_template", "return_dict"})
