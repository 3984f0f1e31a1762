"""Parse and validate a submitted JSONL file, whole, before anything is stored.

Two line forms are accepted, one per file:
- simple: {"prompt": "...", "max_tokens": 128, "custom_id": "a1"}  (or "messages")
- OpenAI batch: {"custom_id": ..., "method": "POST", "url": "/v1/completions"
  | "/v1/chat/completions", "body": {...}}

Every problem raises JobFileError naming the file, the line and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.body import BodyProblem, ParsedBody, parse_body
from fsched.core.jobs.limits import InputLimits
from fsched.core.jobs.shapes import CHAT_ROLES
from fsched.core.jobs.values import BadValue, json_type, printable, shown, storable
from fsched.core.types import Endpoint, RequestSpec

__all__ = ["CHAT_ROLES", "JobFileError", "ParsedJobFile", "load_json_object", "parse_job_file",
           "parse_openai_body", "printable"]

OPENAI_ENVELOPE_KEYS = frozenset({"custom_id", "method", "url", "body"})


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
    lines = 0
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        text = _decoded_line(raw, source, line_no, limits)
        if not text.strip():
            continue
        if len(requests) >= limits.max_lines:
            raise JobFileError(source, f"more than {limits.max_lines:,} requests in one file", line_no)
        lines += 1
        try:
            specs = _parse_line(text, line_no, form, limits, default_max_tokens, lines)
        except _LineError as exc:
            raise JobFileError(source, exc.message, line_no, exc.field) from None
        custom_id = specs[0].custom_id
        if custom_id in seen_ids:
            raise JobFileError(
                source,
                f"duplicate custom_id {shown(custom_id)} (first on line {seen_ids[custom_id]})",
                line_no,
                "custom_id",
            )
        seen_ids[custom_id] = line_no
        requests.extend(specs)

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
) -> tuple[RequestSpec, ...]:
    """The line's requests: one per choice it asks for."""
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
    endpoint: Endpoint, body: dict, limits: InputLimits, default_max_tokens: int,
    custom_id: str = "request", online: bool = False,
) -> ParsedBody:
    """One OpenAI request body (what a batch line's `body` holds) as requests, one per choice.

    The same checks as a batch line's (`online`: an HTTP request, which may also stream and choose
    its class and priority); a problem raises JobFileError naming the body's field.
    """
    try:
        return parse_body(endpoint, body, limits, default_max_tokens, custom_id, online)
    except BodyProblem as exc:
        raise JobFileError("<body>", exc.message, field=exc.field) from None


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
        raise _LineError(None, f"each line must be a JSON object, got {json_type(obj)}")
    if _depth(obj) > max_depth:
        raise _LineError(None, f"JSON nested deeper than {max_depth} levels")
    if _SURROGATE_ESCAPE.search(text):
        _no_lone_surrogate(obj)
    return obj


# A lone UTF-16 surrogate reaches a string only through a \uD800-\uDFFF escape (UTF-8 text cannot
# hold one); pairs decode to one character, so only such text needs the walk.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogate(obj: Any) -> None:
    """Refuse any key or string holding a lone surrogate: no database column, tokenizer or JSON
    encoder takes one, so it would fail wherever it went next."""
    stack = [(None, obj)]
    while stack:
        top, node = stack.pop()
        pairs = node.items() if isinstance(node, dict) else ((None, v) for v in node)
        for key, value in pairs:
            field = top or key
            for text in (key, value):
                bad = _LONE.search(text) if isinstance(text, str) else None
                if bad is not None:
                    raise _LineError(field, f"holds a lone surrogate \\u{ord(bad.group()):04x} (not valid "
                                            "Unicode: a UTF-16 surrogate must come in a pair)")
            if isinstance(value, dict | list):
                stack.append((field, value))


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


def _parse_simple(obj: dict, limits: InputLimits, default_max_tokens: int, index: int
                  ) -> tuple[RequestSpec, ...]:
    """A simple line: a request body of its own, plus an optional custom_id."""
    custom_id = _custom_id(obj["custom_id"], limits) if "custom_id" in obj else f"request-{index}"
    body = {k: v for k, v in obj.items() if k != "custom_id"}
    has_prompt, has_messages = "prompt" in body, "messages" in body
    if has_prompt and has_messages:
        raise _LineError("prompt", "give either 'prompt' or 'messages', not both")
    if not has_prompt and not has_messages:
        raise _LineError("prompt", "missing: give 'prompt' (text) or 'messages' (chat)")
    endpoint = Endpoint.COMPLETIONS if has_prompt else Endpoint.CHAT
    return _body_specs(endpoint, body, limits, default_max_tokens, custom_id, "").specs


def _parse_openai(obj: dict, limits: InputLimits, default_max_tokens: int) -> tuple[RequestSpec, ...]:
    for key in obj:
        if key not in OPENAI_ENVELOPE_KEYS:
            what = "unknown field" if key else 'unknown field: the empty name ""'
            raise _LineError(key, f"{what} (accepted: {', '.join(sorted(OPENAI_ENVELOPE_KEYS))})")
    for key in ("custom_id", "method", "url", "body"):
        if key not in obj:
            raise _LineError(key, "missing (required in the OpenAI batch form)")
    custom_id = _custom_id(obj["custom_id"], limits)
    if obj["method"] != "POST":
        raise _LineError("method", f'unsupported method {shown(obj["method"])}; only "POST"')
    try:
        endpoint = Endpoint(obj["url"])
    except ValueError:
        raise _LineError(
            "url",
            f'unsupported url {shown(obj["url"])}; use "/v1/completions" or "/v1/chat/completions"',
        ) from None
    body = obj["body"]
    if not isinstance(body, dict):
        raise _LineError("body", f"must be an object, got {json_type(body)}")
    return _body_specs(endpoint, body, limits, default_max_tokens, custom_id, "body.").specs


def _body_specs(endpoint: Endpoint, body: dict, limits: InputLimits, default_max_tokens: int,
                custom_id: str, prefix: str, online: bool = False) -> ParsedBody:
    try:
        return parse_body(endpoint, body, limits, default_max_tokens, custom_id, online)
    except BodyProblem as exc:
        raise _LineError(f"{prefix}{exc.field}" if exc.field else None, exc.message) from None


def _custom_id(value: Any, limits: InputLimits) -> str:
    if not isinstance(value, str) or not value:
        raise _LineError("custom_id", f"must be a non-empty string, got {json_type(value)}")
    if len(value) > limits.max_custom_id_chars:
        raise _LineError("custom_id", f"longer than {limits.max_custom_id_chars} characters")
    try:
        return storable(value)
    except BadValue as exc:
        raise _LineError("custom_id", exc.message) from None
