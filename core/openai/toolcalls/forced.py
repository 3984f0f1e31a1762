"""The grammar a required or named tool call is held to: a JSON array of calls, each
`{"name": <one of the tools>, "arguments": <valid against that tool's parameters>}`.

`forced_format` is the one place that turns tools into a constraint; the
request's grammar is then compiled and enforced as any structured output is.
With `strict`, every object of a tool's schema is closed (`additionalProperties:
false`), as OpenAI's strict mode defines it.
"""

from __future__ import annotations

from typing import Any

from fsched.core.types import ResponseFormat


def forced_format(tools: list[dict], named: str | None, parallel: bool) -> ResponseFormat:
    chosen = [t["function"] for t in tools if named is None or t["function"]["name"] == named]
    items = [_call_schema(f) for f in chosen]
    array: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
                             "minItems": 1}
    if not parallel or named is not None:
        array["maxItems"] = 1
    return ResponseFormat.json_schema(array, "tool_calls", True)


def _call_schema(function: dict) -> dict:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if function.get("strict"):
        parameters = closed(parameters)
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def closed(schema: Any) -> Any:
    """The schema with every object closed to properties it does not name."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if out.get("type") == "object" or "properties" in out:
        out.setdefault("additionalProperties", False)
    return out
