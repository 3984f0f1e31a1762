"""OpenAI's Responses API (POST /v1/responses) for text, in fsched's terms: pure, no I/O.

A Responses body is a chat request in other words: `input` (a string, or
messages) after `instructions` (a system message), `max_output_tokens`,
`text.format` (structured output), `top_logprobs`. `to_chat_body` says it in
chat's words, so the chat parser checks it (its errors name the Responses
field); every field of the Responses body is in `RESPONSES_FIELDS`, honoured
or refused by name as the chat fields are. The answer is a `response` object
with one assistant message, and a stream is the Responses event sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.inputs import InputError, json_type
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.answers import AnswerChoice, padding
from fsched.core.openai.fields import TEMPERATURE_TEXT, TOP_P_TEXT, BodyField, Support
from fsched.core.openai.responses_items import ItemsStream
from fsched.core.openai.toolcalls.message import call_id, read_options
from fsched.core.openai.toolcalls.reading import read
from fsched.core.openai.values import Boolean, Custom, Integer, Number, Text
from fsched.core.ports.records import RequestProgress
from fsched.core.types import AnswerOptions

LOGPROBS_INCLUDE = "message.output_text.logprobs"
INPUT_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


def _input(value: Any, limits: InputLimits) -> list[dict]:
    """`input`: a string (one user message) or items: messages with text content, the model's
    function calls (consecutive ones make one assistant message) and their outputs, and earlier
    reasoning items (not given to the template: chat templates drop an earlier turn's reasoning)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InputError(f"must be a string or a non-empty array of messages, got {json_type(value)}")
    out: list[dict] = []
    for i, item in enumerate(value):
        kind = item.get("type", "message") if isinstance(item, dict) else "message"
        if kind == "function_call":
            _add_call(out, item, f"[{i}]")
        elif kind == "function_call_output":
            out.append(_call_output(item, f"[{i}]"))
        elif kind != "reasoning":
            out.append(_input_message(item, f"[{i}]"))
    if not out:
        raise InputError("no message in the input")
    return out


def _add_call(out: list[dict], item: dict, where: str) -> None:
    name, arguments, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
    for field, value in (("name", name), ("arguments", arguments), ("call_id", call_id)):
        if not isinstance(value, str):
            raise InputError("must be a string", f"{where}.{field}")
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
        out[-1]["tool_calls"].append(call)
    elif out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
        out[-1]["tool_calls"] = [call]
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict, where: str) -> dict:
    output = item.get("output")
    if isinstance(output, list):
        output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
    if not isinstance(output, str) or not isinstance(item.get("call_id"), str):
        raise InputError("must be {call_id, output} with text output", where)
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _input_message(item: Any, where: str) -> dict:
    if not isinstance(item, dict):
        raise InputError(f"must be an object, got {json_type(item)}", where)
    kind = item.get("type", "message")
    if kind != "message":
        raise InputError(f"not an input item fsched takes (message, function_call, function_call_output, "
                         f"reasoning): {kind!r}", f"{where}.type")
    unknown = set(item) - {"type", "role", "content", "id", "status"}
    if unknown:
        raise InputError("unknown field of a message item", f"{where}.{sorted(unknown)[0]}")
    role = item.get("role")
    if role not in INPUT_ROLES:
        raise InputError(f"must be one of {', '.join(INPUT_ROLES)}", f"{where}.role")
    content = item.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS
                    and isinstance(part.get("text"), str)):
                raise InputError(f'only text parts ({", ".join(TEXT_PARTS)})', f"{where}.content[{j}]")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise InputError("must be a string or a list of text parts", f"{where}.content")
    return {"role": role, "content": content}


def _text_config(value: Any, limits: InputLimits) -> dict:
    """`text`: {format: {type: text | json_object | json_schema, name, schema, strict}, verbosity}."""
    if not isinstance(value, dict):
        raise InputError(f"must be an object, got {json_type(value)}")
    unknown = set(value) - {"format", "verbosity"}
    if unknown:
        raise InputError("unknown field of text", f".{sorted(unknown)[0]}")
    if value.get("verbosity") not in (None, "medium"):
        raise InputError("the models fsched serves have no verbosity setting; accepted: medium", ".verbosity")
    fmt = value.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise InputError(f"must be an object, got {json_type(fmt)}", ".format")
    if fmt.get("type") != "json_schema":
        return {"type": fmt.get("type")}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def _include(value: Any, limits: InputLimits) -> bool:
    if not isinstance(value, list) or any(v != LOGPROBS_INCLUDE for v in value):
        raise InputError(f"fsched includes {LOGPROBS_INCLUDE!r} only (no tools, no reasoning to include)")
    return bool(value)


def _tools(value: Any, limits: InputLimits) -> list[dict]:
    """Responses' function tools ({type: "function", name, description, parameters, strict}) in chat's
    shape, which the chat parser then checks."""
    if not isinstance(value, list):
        raise InputError(f"must be an array of tools, got {json_type(value)}")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InputError('only function tools ({"type": "function", "name", ...}): fsched runs no '
                             "hosted tools", f"[{i}]")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(value: Any, limits: InputLimits) -> str | dict:
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    if value in ("none", "auto", "required"):
        return value
    raise InputError('must be "none", "auto", "required" or {"type": "function", "name"}')


def _reasoning(value: Any, limits: InputLimits) -> str | None:
    """`reasoning`: {effort, summary}; the effort goes to the chat template as reasoning_effort."""
    if not isinstance(value, dict) or set(value) - {"effort", "summary", "generate_summary"}:
        raise InputError("must be an object {effort, summary}")
    return value.get("effort")


def _f(name: str, support: Support, note: str, **kw: Any) -> BodyField:
    return BodyField(name, frozenset(), support, note, **kw)


S, HINT, N, R = Support.SUPPORTED, Support.HINT, Support.NEUTRAL, Support.REFUSED
_CACHE_HINT = "routes requests to OpenAI's prompt cache; fsched has no such router"
RESPONSES_FIELDS = (
    _f("model", S, "names the model in the answer", kind=Text(256), example="m"),
    _f("input", S, "a string, or messages with text content", kind=Custom(_input, "string or items"),
       example="hi"),
    _f("instructions", S, "a system message before the input", kind=Text(1 << 20), example="Be brief."),
    _f("max_output_tokens", S, "the most tokens to generate", kind=Integer(1), example=7),
    _f("temperature", S, TEMPERATURE_TEXT, kind=Number(0.0, 2.0), neutral=(1,), example=0.5),
    _f("top_p", S, TOP_P_TEXT, kind=Number(0.0, 1.0, low_open=True), neutral=(1,), example=0.9),
    _f("top_logprobs", S, "log probabilities of the output text's tokens with this many alternatives",
       kind=Integer(0, 20), example=2),
    _f("include", S, f"{LOGPROBS_INCLUDE!r}: the output text's logprobs", kind=Custom(_include, "array"),
       neutral=([],), example=[LOGPROBS_INCLUDE]),
    _f("text", S, "format: json_object or json_schema (structured output, as chat's response_format)",
       kind=Custom(_text_config, "object"), neutral=({},), example={"format": {"type": "json_object"}}),
    _f("stream", S, "the Responses event stream", kind=Boolean(), neutral=(False,), example=True),
    _f("stream_options", S, "include_obfuscation: random padding in an obfuscation field of each delta",
       kind=Custom(lambda v, lim: v, "object"), example={"include_obfuscation": True}),
    _f("service_tier", S, "the class, as on chat", kind=Text(16, ("auto", "default", "flex", "priority")),
       neutral=("auto",), example="flex"),
    _f("user", HINT, "identifies the end user to OpenAI's monitoring; fsched keeps none", kind=Text(),
       example="u"),
    _f("safety_identifier", HINT, "identifies the end user to OpenAI's safety systems", kind=Text(),
       example="u"),
    _f("prompt_cache_key", HINT, _CACHE_HINT, kind=Text(), example="k"),
    _f("prompt_cache_retention", HINT, _CACHE_HINT, kind=Text(16, ("in_memory", "24h")), example="24h"),
    _f("prompt_cache_options", HINT, _CACHE_HINT, kind=Custom(lambda v, lim: v, "object"),
       example={"ttl": "30m"}),
    _f("store", N, "fsched keeps no responses to retrieve later (GET /v1/responses/{id} is not served); "
       "both values are accepted, as true is the default", neutral=(True, False), example="yes"),
    _f("background", N, "fsched answers within the request", neutral=(False,), example=True),
    _f("truncation", N, "a prompt too long for the context is refused, never cut", neutral=("disabled",),
       example="auto"),
    _f("metadata", N, "labels a stored response; fsched stores none", neutral=({},), example={"a": "b"}),
    _f("reasoning", S, "effort: given to the chat template as reasoning_effort (as chat's field); the "
       "model's reasoning comes back as a reasoning output item", kind=Custom(_reasoning, "object"),
       neutral=({},), example={"effort": "high"}),
    _f("tools", S, "function tools, as chat's tools; calls come back as function_call output items",
       kind=Custom(_tools, "array"), neutral=([],),
       example=[{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
    _f("tool_choice", S, "as chat's tool_choice (a named function: {type: function, name})",
       kind=Custom(_tool_choice, "string or object"), neutral=("none", "auto"), example="required"),
    _f("parallel_tool_calls", S, "as chat's parallel_tool_calls", kind=Boolean(), neutral=(True,),
       example=False),
    _f("max_tool_calls", N, "fsched does not run tools itself (the client runs them)", example=3),
    _f("previous_response_id", R, "fsched keeps no responses to continue from", example="resp_1"),
    _f("conversation", R, "fsched keeps no conversations", example="conv_1"),
    _f("prompt", R, "prompt templates are not kept by fsched", example={"id": "pmpt_1"}),
    _f("context_management", R, "fsched does not compact contexts", example=[{"type": "compaction"}]),
    _f("moderation", R, "fsched runs no moderation model", example={"model": "omni-moderation"}),
    _f("background_options", N, "fsched answers within the request", neutral=({},), example={"a": 1}),
    _f("image", R, "fsched serves text generation only", example={"size": "auto"}),
    _f("access_programs", R, "fsched has no access programs", example={"type": "standard"}),
)
_BY_NAME = {f.name: f for f in RESPONSES_FIELDS}
# A chat field's Responses name, for errors the chat parser raises.
RESPONSES_NAME = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text",
                  "logprobs": "include"}


@dataclass(slots=True, frozen=True)
class ResponsesRequest:
    chat_body: dict  # the same request as a chat body
    echo: dict  # the request's fields a `response` object repeats


def to_chat_body(body: dict, limits: InputLimits = InputLimits()) -> ResponsesRequest:
    """The Responses body as a chat completions body; InputError names a Responses field."""
    values = {}
    for key, value in body.items():
        spec = _BY_NAME.get(key)
        if spec is None:
            raise InputError("unknown field (docs/http.md lists the fields of /v1/responses)", key)
        if value is None:
            continue
        if spec.support in (Support.NEUTRAL, Support.REFUSED):
            if spec.is_neutral(value):
                continue
            raise InputError(spec.note, key)
        try:
            values[key] = spec.kind.check(value, limits)
        except InputError as exc:
            raise exc.within(key) from None
    if "input" not in values:
        raise InputError("missing: give 'input' (a string or messages)", "input")
    return ResponsesRequest(_chat_of(values), _echo_of(values))


def _chat_of(values: dict) -> dict:
    messages = list(values["input"])
    if "instructions" in values:
        messages.insert(0, {"role": "system", "content": values["instructions"]})
    chat: dict = {"messages": messages}
    renamed = {"max_output_tokens": "max_tokens", "text": "response_format"}
    for key in ("model", "temperature", "top_p", "stream", "service_tier", "user", "safety_identifier",
                "prompt_cache_key", "prompt_cache_retention", "max_output_tokens", "text", "tools",
                "tool_choice", "parallel_tool_calls"):
        if key in values:
            chat[renamed.get(key, key)] = values[key]
    if values.get("reasoning"):
        chat["reasoning_effort"] = values["reasoning"]
    if values.get("include") or "top_logprobs" in values:
        chat["logprobs"] = True
        chat["top_logprobs"] = values.get("top_logprobs", 0)
    options = values.get("stream_options")
    if options:
        if not isinstance(options, dict) or set(options) - {"include_obfuscation"}:
            raise InputError('must be an object {"include_obfuscation": bool}', "stream_options")
        chat["stream_options"] = options
    return chat


def _echo_of(values: dict) -> dict:
    text = values.get("text") or {"type": "text"}
    fmt = {"type": text["type"]}
    if text["type"] == "json_schema":
        fmt.update({"strict": False, **text["json_schema"]})
    return {"instructions": values.get("instructions"), "max_output_tokens": values.get("max_output_tokens"),
            "temperature": values.get("temperature", 1.0), "top_p": values.get("top_p", 1.0),
            "top_logprobs": values.get("top_logprobs"), "text": {"format": fmt, "verbosity": "medium"},
            "service_tier": values.get("service_tier", "auto"), "user": values.get("user"),
            "metadata": {}, "tools": [{"type": "function", **t["function"]} for t in values.get("tools", [])],
            "tool_choice": _echo_choice(values.get("tool_choice", "auto")),
            "parallel_tool_calls": values.get("parallel_tool_calls", True),
            "truncation": "disabled", "store": False, "background": False}


def _echo_choice(choice: str | dict) -> str | dict:
    return choice if isinstance(choice, str) else {"type": "function", "name": choice["function"]["name"]}


# -- the answer ---------------------------------------------------------------------------------


def response_object(response_id: str, created: float, model: str, echo: dict, choice: AnswerChoice | None,
                    status: str = "completed", logprobs: bool = False,
                    answer: AnswerOptions = AnswerOptions()) -> dict:
    """A `response`: its status, its output items (none while in progress), usage when done."""
    output = [] if choice is None else output_items(response_id, choice, answer, logprobs)
    incomplete = choice is not None and choice.finish_reason == "length"
    out = {"id": response_id, "object": "response", "created_at": created, "model": model,
           "status": "incomplete" if incomplete and status == "completed" else status,
           "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
           "output": output, "usage": None if choice is None else _usage(choice), **echo}
    if status == "completed":
        out["completed_at"] = created
    return out


def output_items(response_id: str, choice: AnswerChoice, answer: AnswerOptions, logprobs: bool) -> list[dict]:
    """The answer's items: with tools (or a prompt that opened the reasoning), its reasoning, its message
    (when it has text) and one function_call a call, as the text reads (the chat answer's reading);
    without, one message."""
    lps = _logprobs(choice.logprobs) if logprobs else []
    if not itemized(answer):
        return [message_item(response_id, choice.text, "completed", lps)]
    reading = read(choice.text, True, read_options(answer))
    suffix = response_id.removeprefix("resp_")
    items = []
    if reading.reasoning is not None:
        items.append({"type": "reasoning", "id": f"rs_{suffix}", "summary": [], "status": "completed",
                      "content": [{"type": "reasoning_text", "text": reading.reasoning}]})
    calls = reading.finished_calls()
    if reading.content or not calls:
        items.append(message_item(response_id, reading.content, "completed", lps))
    for i, call in enumerate(calls):
        items.append({"type": "function_call", "id": f"fc_{suffix}_{i}",
                      "call_id": call_id(response_id, 0, i), "name": call.name, "arguments": call.arguments,
                      "status": "completed"})
    return items


def itemized(answer: AnswerOptions) -> bool:
    """Whether the answer's text is read into items (reasoning, message, calls), not shown whole."""
    return bool(answer.tools) or answer.thinking


def message_item(response_id: str, text: str | None, status: str, logprobs: list) -> dict:
    content = [] if text is None else [_text_part(text, logprobs)]
    return {"type": "message", "id": f"msg_{response_id.removeprefix('resp_')}", "status": status,
            "role": "assistant", "content": content}


def _text_part(text: str, logprobs: list) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _usage(choice: AnswerChoice) -> dict:
    prompt = choice.prompt_tokens or 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": choice.num_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + choice.num_tokens}


def _logprobs(records: Sequence) -> list[dict]:
    return [{"token": t.chosen.text, "logprob": t.chosen.logprob, "bytes": list(t.chosen.text.encode()),
             "top_logprobs": [{"token": a.text, "logprob": a.logprob, "bytes": list(a.text.encode())}
                              for a in t.top]} for t in records]


class ResponsesRelay:
    """The Responses event stream of one request: created, in_progress, the message item and its text
    part opened, a delta per batch of new text, their done events, completed. With tools, the items
    the answer's reading shows, as they are written (responses_items.py)."""

    def __init__(self, response_id: str, created: float, model: str, echo: dict, logprobs: bool,
                 obfuscation: bool = False, answer: AnswerOptions = AnswerOptions()):
        self.response_id, self.created, self.model, self.echo = response_id, created, model, echo
        self.answer = answer
        self.logprobs = logprobs
        self.obfuscation = obfuscation
        self.seq = 0
        self.chars = 0
        self.tokens = 0
        self.item_id = message_item(response_id, None, "in_progress", [])["id"]
        self.items = ItemsStream(response_id, read_options(answer), self._event) if itemized(answer) else None

    def _event(self, kind: str, **fields: Any) -> dict:
        out = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return out

    def opening(self) -> Iterator[dict]:
        pending = response_object(self.response_id, self.created, self.model, self.echo, None, "in_progress")
        yield self._event("response.created", response=pending)
        yield self._event("response.in_progress", response=pending)
        if self.items is not None:
            return
        yield self._event("response.output_item.added", output_index=0,
                          item=message_item(self.response_id, None, "in_progress", []))
        yield self._event("response.content_part.added", item_id=self.item_id, output_index=0,
                          content_index=0, part=_text_part("", []))

    def update(self, choices: Sequence[RequestProgress]) -> Iterator[dict]:
        (p,) = choices
        if self.items is not None:
            yield from self.items.update(p.visible_text)
            return
        text = p.visible_text
        if len(text) <= self.chars:
            return
        count = len(p.logprobs)
        logprobs = _logprobs(p.logprobs[self.tokens:count]) if self.logprobs else []
        extra = {"obfuscation": padding()} if self.obfuscation else {}
        yield self._event("response.output_text.delta", item_id=self.item_id, output_index=0,
                          content_index=0, delta=text[self.chars:], logprobs=logprobs, **extra)
        self.chars, self.tokens = len(text), count

    def closing(self, final: Sequence[RequestProgress], choice: AnswerChoice) -> Iterator[dict]:
        done = response_object(self.response_id, self.created, self.model, self.echo, choice,
                               logprobs=self.logprobs, answer=self.answer)
        if self.items is not None:
            yield from self.items.close(choice.text, done["output"])
        else:
            yield from self.update(final)
            logprobs = _logprobs(choice.logprobs) if self.logprobs else []
            part = _text_part(choice.text, logprobs)
            yield self._event("response.output_text.done", item_id=self.item_id, output_index=0,
                              content_index=0, text=choice.text, logprobs=logprobs)
            yield self._event("response.content_part.done", item_id=self.item_id, output_index=0,
                              content_index=0, part=part)
            yield self._event("response.output_item.done", output_index=0, item=done["output"][0])
        kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
        yield self._event(kind, response=done)
