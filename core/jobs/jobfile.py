"""Parse and validate a submitted JSONL file, whole, before anything is stored.

Two line forms are accepted, one per file:
- simple: {"prompt": "...", "max_tokens": 128, "custom_id": "a1"}  (or "messages")
- OpenAI batch: {"custom_id": ..., "method": "POST", "url": "/v1/completions"
  | "/v1/chat/completions", "body": {...}}

Every problem raises JobFileError naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.limits import InputLimits
from fsched.core.types import MAX_SEED, ChatMessage, Endpoint, RequestSpec, SamplingParams

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
OPENAI_ENVELOPE_KEYS = frozenset({"custom_id", "method", "url", "body"})
SAMPLING_KEYS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"})
SIMPLE_KEYS = SAMPLING_KEYS | {"prompt", "messages", "custom_id"}
# OpenAI body fields that cannot change what fsched generates; accepted and ignored.
IGNORED_BODY_KEYS = frozenset({"model", "stream", "user", "n", "max_completion_tokens"})
BODY_KEYS = SAMPLING_KEYS | IGNORED_BODY_KEYS | {"prompt", "messages"}
# What a stored string may not hold: a NUL (PostgreSQL's text refuses it) or a
# lone surrogate (JSON's "\ud800" escape: not Unicode, so not storable as UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
SHOWN_CHARS = 80  # a value quoted in an error is cut to this many characters


class JobFileError(ValueError):
    """A submitted file is not acceptable; nothing of it may be stored."""

    def __init__(self, source: str, message: str, line: int | None = None, field: str | None = None):
        self.source = source
        self.line = line
        self.field = field
        self.message = message
        # File and field names come from the user: one line, no terminal escapes.
        where = printable(source, 200) if line is None else f"{printable(source, 200)}, line {line}"
        if field is not None:
            where += f", field '{printable(field)}'"
        super().__init__(f"{where}: {printable(message, 1000)}")


def printable(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` fit for one line of an error: control characters escaped, cut to `limit`."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _shown(value: Any) -> str:
    """A JSON value quoted in an error message, cut short."""
    return printable(repr(value))


class _LineError(Exception):
    """Raised inside one line's checks; the caller adds file and line."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(slots=True, frozen=True)
class ParsedJobFile:
    source: str
    requests: tuple[RequestSpec, ...]
    form: str  # "simple" or "openai"


def parse_job_file(
    data: bytes,
    source: str,
    limits: InputLimits = InputLimits(),
    default_max_tokens: int | None = None,
) -> ParsedJobFile:
    """Validate `data` (a whole JSONL file) into request specs, or raise JobFileError."""
    if len(data) > limits.max_bytes:
        raise JobFileError(source, f"file is {len(data):,} bytes, over the limit of {limits.max_bytes:,}")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte order mark, as editors on Windows write
    default_max_tokens = default_max_tokens or limits.default_max_tokens
    if not 1 <= default_max_tokens <= limits.max_tokens:
        raise JobFileError(source, f"--max-tokens must be within 1..{limits.max_tokens:,}")

    requests: list[RequestSpec] = []
    seen_ids: dict[str, int] = {}
    form = _FormOfFile()
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        text = _decoded_line(raw, source, line_no, limits)
        if not text.strip():
            continue
        if len(requests) >= limits.max_lines:
            raise JobFileError(source, f"more than {limits.max_lines:,} requests in one file", line_no)
        try:
            spec = _parse_line(text, line_no, form, limits, default_max_tokens, len(requests) + 1)
        except _LineError as exc:
            raise JobFileError(source, exc.message, line_no, exc.field) from None
        if spec.custom_id in seen_ids:
            raise JobFileError(
                source,
                f"duplicate custom_id {_shown(spec.custom_id)} (first on line {seen_ids[spec.custom_id]})",
                line_no,
                "custom_id",
            )
        seen_ids[spec.custom_id] = line_no
        requests.append(spec)

    if not requests:
        raise JobFileError(source, "file has no requests (it is empty or blank)")
    return ParsedJobFile(source=source, requests=tuple(requests), form=form.name or "simple")


@dataclass(slots=True)
class _FormOfFile:
    """The form the first request of a file took, which every later line must keep."""

    name: str | None = None
    line: int = 0


def _decoded_line(raw: bytes, source: str, line_no: int, limits: InputLimits) -> str:
    if len(raw) > limits.max_line_bytes:
        raise JobFileError(
            source, f"line is {len(raw):,} bytes, over the limit of {limits.max_line_bytes:,}", line_no
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobFileError(source, f"not valid UTF-8 (byte {exc.start + 1} of the line)", line_no) from None


def _parse_line(
    text: str, line_no: int, form: _FormOfFile, limits: InputLimits, default_max_tokens: int, index: int
) -> RequestSpec:
    obj = _load_json(text, limits.max_depth)
    line_form = "openai" if OPENAI_ENVELOPE_KEYS & obj.keys() - {"custom_id"} else "simple"
    if form.name is None:
        form.name, form.line = line_form, line_no
    elif line_form != form.name:
        raise _LineError(
            None,
            f"mixes the {line_form} form with the {form.name} form of line {form.line}; "
            "use one form per file",
        )
    if line_form == "openai":
        return _parse_openai(obj, limits, default_max_tokens)
    return _parse_simple(obj, limits, default_max_tokens, index)


def load_json_object(text: str, max_depth: int) -> dict:
    """One JSON object by the job file's rules (finite numbers, unique keys, bounded depth).

    Raises JobFileError (source "<body>", the offending field when known).
    """
    try:
        return _load_json(text, max_depth)
    except _LineError as exc:
        raise JobFileError("<body>", exc.message, field=exc.field) from None


def parse_openai_body(
    endpoint: Endpoint, body: dict, limits: InputLimits, default_max_tokens: int, custom_id: str = "request"
) -> RequestSpec:
    """One OpenAI request body (what a batch line's `body` holds) as a request spec.

    The same checks as a batch line's; a problem raises JobFileError naming the body's field.
    """
    envelope = {"custom_id": custom_id, "method": "POST", "url": endpoint.value, "body": body}
    try:
        return _parse_openai(envelope, limits, default_max_tokens)
    except _LineError as exc:
        field = exc.field[len("body."):] if exc.field and exc.field.startswith("body.") else exc.field
        raise JobFileError("<body>", exc.message, field=field) from None


def _reject_constant(name: str) -> Any:
    raise _LineError(None, f"{name} is not valid JSON (numbers must be finite)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _LineError(key, "duplicate key (a JSON object names each key once)")
            seen.add(key)
    return obj


def _load_json(text: str, max_depth: int) -> dict:
    try:
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise _LineError(None, f"JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise _LineError(None, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise _LineError(None, f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _LineError(None, f"each line must be a JSON object, got {_json_type(obj)}")
    if _depth(obj) > max_depth:
        raise _LineError(None, f"JSON nested deeper than {max_depth} levels")
    return obj


def _depth(obj: Any) -> int:
    """Nesting depth of containers, iteratively (no recursion to exhaust)."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return deepest


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _parse_simple(obj: dict, limits: InputLimits, default_max_tokens: int, index: int) -> RequestSpec:
    _reject_unknown(obj, SIMPLE_KEYS, "")
    custom_id = _custom_id(obj["custom_id"], limits) if "custom_id" in obj else f"request-{index}"
    endpoint, prompt, messages = _prompt_or_messages(obj, "")
    return RequestSpec(
        custom_id=custom_id,
        endpoint=endpoint,
        params=_sampling(obj, limits, default_max_tokens, ""),
        prompt=prompt,
        messages=messages,
    )


def _parse_openai(obj: dict, limits: InputLimits, default_max_tokens: int) -> RequestSpec:
    _reject_unknown(obj, OPENAI_ENVELOPE_KEYS, "")
    for key in ("custom_id", "method", "url", "body"):
        if key not in obj:
            raise _LineError(key, "missing (required in the OpenAI batch form)")
    custom_id = _custom_id(obj["custom_id"], limits)
    if obj["method"] != "POST":
        raise _LineError("method", f'unsupported method {_shown(obj["method"])}; only "POST"')
    try:
        endpoint = Endpoint(obj["url"])
    except ValueError:
        raise _LineError(
            "url",
            f'unsupported url {_shown(obj["url"])}; use "/v1/completions" or "/v1/chat/completions"',
        ) from None
    body = obj["body"]
    if not isinstance(body, dict):
        raise _LineError("body", f"must be an object, got {_json_type(body)}")
    _reject_unknown(body, BODY_KEYS, "body.")
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        raise _LineError("body.n", "only n=1 is supported")
    body_endpoint, prompt, messages = _prompt_or_messages(body, "body.")
    if body_endpoint is not endpoint:
        wanted = "prompt" if endpoint is Endpoint.COMPLETIONS else "messages"
        raise _LineError(f"body.{wanted}", f"missing ({endpoint.value} takes '{wanted}')")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _LineError("body.model", f"must be a string, got {_json_type(model)}")
    if model is not None:
        model = _storable(model, "body.model")
    for key, kind, ok in (("stream", "a boolean", bool), ("user", "a string", str)):
        if body.get(key) is not None and not isinstance(body[key], ok):
            raise _LineError(f"body.{key}", f"must be {kind}, got {_json_type(body[key])}")
    if body.get("max_completion_tokens") is not None:
        # The newer name of max_tokens: checked alike; both at once must agree.
        given = _integer(body, "max_completion_tokens", "body.", 1, limits.max_tokens, None)
        if body.get("max_tokens") is None:
            body = {**body, "max_tokens": given}
        elif _integer(body, "max_tokens", "body.", 1, limits.max_tokens, None) != given:
            raise _LineError("body.max_completion_tokens", "differs from max_tokens; give one of them")
    return RequestSpec(
        custom_id=custom_id,
        endpoint=endpoint,
        params=_sampling(body, limits, default_max_tokens, "body."),
        prompt=prompt,
        messages=messages,
        model=model,
    )


def _reject_unknown(obj: dict, allowed: frozenset[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            what = "unknown field" if key else 'unknown field: the empty name ""'
            raise _LineError(f"{prefix}{key}", f"{what} (accepted: {', '.join(sorted(allowed))})")


def _custom_id(value: Any, limits: InputLimits) -> str:
    if not isinstance(value, str) or not value:
        raise _LineError("custom_id", f"must be a non-empty string, got {_json_type(value)}")
    if len(value) > limits.max_custom_id_chars:
        raise _LineError("custom_id", f"longer than {limits.max_custom_id_chars} characters")
    return _storable(value, "custom_id")


def _storable(text: str, field: str) -> str:
    """`text` unless it holds a character no database column takes."""
    bad = _UNSTORABLE.search(text)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "a lone surrogate (not valid Unicode)"
        raise _LineError(field, f"contains {what}: \\u{ord(bad.group()):04x} at character {bad.start() + 1}")
    return text


def _prompt_or_messages(obj: dict, prefix: str) -> tuple[Endpoint, str | None, tuple[ChatMessage, ...]]:
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt and has_messages:
        raise _LineError(f"{prefix}prompt", "give either 'prompt' or 'messages', not both")
    if not has_prompt and not has_messages:
        raise _LineError(f"{prefix}prompt", "missing: give 'prompt' (text) or 'messages' (chat)")
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise _LineError(f"{prefix}prompt", f"must be a string, got {_json_type(prompt)}")
        if not prompt:
            raise _LineError(f"{prefix}prompt", "must not be empty")
        return Endpoint.COMPLETIONS, _storable(prompt, f"{prefix}prompt"), ()
    return Endpoint.CHAT, None, _messages(obj["messages"], f"{prefix}messages")


def _messages(value: Any, field: str) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise _LineError(field, "must be a non-empty array of {role, content} objects")
    messages = []
    for i, message in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise _LineError(where, f"must be an object, got {_json_type(message)}")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise _LineError(f"{where}.role", f"must be one of {', '.join(sorted(CHAT_ROLES))}")
        messages.append(ChatMessage(role=role, content=_content(message.get("content"), where)))
    return tuple(messages)


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of {"type": "text"} parts."""
    if isinstance(value, str):
        return _storable(value, f"{where}.content")
    if isinstance(value, list) and value:
        parts = []
        for j, part in enumerate(value):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise _LineError(f"{where}.content[{j}]", 'only {"type": "text", "text": ...} parts')
            parts.append(_storable(part["text"], f"{where}.content[{j}].text"))
        return "".join(parts)
    raise _LineError(f"{where}.content", "must be a string or a list of text parts")


def _sampling(obj: dict, limits: InputLimits, default_max_tokens: int, prefix: str) -> SamplingParams:
    max_tokens = _integer(obj, "max_tokens", prefix, 1, limits.max_tokens, default_max_tokens)
    temperature = _number(obj, "temperature", prefix, 0.0, 2.0, 1.0, lambda x: True)
    top_p = _number(obj, "top_p", prefix, 0.0, 1.0, 1.0, lambda x: x > 0)
    top_k = _integer(obj, "top_k", prefix, 0, 1_000_000, 0)
    seed = _integer(obj, "seed", prefix, 0, MAX_SEED, None) if obj.get("seed") is not None else None
    return SamplingParams(
        max_tokens=max_tokens,
        max_tokens_is_default=obj.get("max_tokens") is None,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=_stop(obj.get("stop"), limits, f"{prefix}stop"),
    )


def _integer(obj: dict, key: str, prefix: str, low: int, high: int, default: int | None) -> int | None:
    if obj.get(key) is None:
        return default
    value = obj[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _LineError(f"{prefix}{key}", f"must be an integer, got {_json_type(value)}")
    if not low <= value <= high:
        raise _LineError(f"{prefix}{key}", f"must be within {low:,}..{high:,}, got {printable(f'{value:,}')}")
    return value


def _number(
    obj: dict,
    key: str,
    prefix: str,
    low: float,
    high: float,
    default: float,
    extra: Callable[[float], bool],
) -> float:
    if obj.get(key) is None:
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _LineError(f"{prefix}{key}", f"must be a number, got {_json_type(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise _LineError(f"{prefix}{key}", "must be a finite number (this one overflows a float)")
    if not (low <= value <= high and extra(value)):
        raise _LineError(f"{prefix}{key}", f"must be within {low}..{high}, got {value}")
    return value


def _stop(value: Any, limits: InputLimits, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise _LineError(field, "must be a non-empty string or an array of non-empty strings")
    if len(value) > limits.max_stop_sequences:
        raise _LineError(field, f"at most {limits.max_stop_sequences} stop sequences")
    return tuple(_storable(s, field) for s in value)
