"""The lines of a submitted file (`fsched submit`, a Batch API input file) as requests.

Two line forms are accepted, one per file:
- simple: {"prompt": "...", "max_tokens": 128, "custom_id": "a1"}  (or "messages")
- OpenAI batch: {"custom_id": ..., "method": "POST", "url": "/v1/completions"
  | "/v1/chat/completions", "body": {...}}

A line's body is read by the same parser as an online request's (`body.py`);
the file's own rules (sizes, encoding, unique custom_ids) are
`core/jobs/jobfile.py`'s. Every problem raises JobFileError naming the file,
the line and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.inputs import InputError, JobFileError, json_type, shown, storable
from fsched.core.jobs.jobfile import parse_lines
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.body import PromptThinking, parse_body
from fsched.core.openai.toolcalls.families import AUTO
from fsched.core.types import Endpoint, RequestSpec

OPENAI_ENVELOPE_KEYS = frozenset({"custom_id", "method", "url", "body"})


def parse_job_file(
    data: bytes,
    source: str,
    limits: InputLimits = InputLimits(),
    default_max_tokens: int | None = None,
    endpoint: Endpoint | None = None,
    tool_parser: str = AUTO,
) -> tuple[RequestSpec, ...]:
    """Validate `data` (a whole JSONL file) into its requests (what a `JobSubmission` stores), or
    raise JobFileError. `endpoint`: a batch's, which every line must ask for (OpenAI's rule; checked
    once every line has parsed); `tool_parser`: the family its lines' tool calls are read in."""
    if len(data) > limits.max_bytes:
        raise JobFileError(source, f"file is {len(data):,} bytes, over the limit of {limits.max_bytes:,}")
    return parse_job_pieces((data,), source, limits, default_max_tokens, endpoint, tool_parser=tool_parser)


def parse_job_pieces(
    pieces: Iterable[bytes],
    source: str,
    limits: InputLimits = InputLimits(),
    default_max_tokens: int | None = None,
    endpoint: Endpoint | None = None,
    thinking: PromptThinking | None = None,
    tenant: str = "",
    tool_parser: str = AUTO,
) -> tuple[RequestSpec, ...]:
    """As `parse_job_file`, of a file read a piece at a time (a stored upload): never held whole.
    `thinking`, `tenant` and `tool_parser`: as `parse_body` takes them."""
    default_max_tokens = default_max_tokens or limits.default_max_tokens
    if not 1 <= default_max_tokens <= limits.max_tokens:
        raise JobFileError(source, f"--max-tokens must be within 1..{limits.max_tokens:,}")
    forms = _LineForms(limits, default_max_tokens, endpoint, _BodyReader(thinking, tenant, tool_parser))
    requests = parse_lines(pieces, source, limits, forms.parse)
    if forms.off_endpoint is not None:
        line_no, asked = forms.off_endpoint
        raise JobFileError(source, f"asks for {asked.value}; this batch's endpoint is {endpoint.value}",
                           line_no, "url")
    return requests


@dataclass(slots=True, frozen=True)
class _BodyReader:
    """What a line's body is read with beyond the limits: the model's template, the tenant."""

    thinking: PromptThinking | None = None
    tenant: str = ""
    tool_parser: str = AUTO  # the family (or response template) a line's tool calls are read in


@dataclass(slots=True)
class _LineForms:
    """A file's line parser: the form its first request took, which every later line must keep."""

    limits: InputLimits
    default_max_tokens: int
    endpoint: Endpoint | None = None  # the one every line must ask for, if any
    reader: _BodyReader = _BodyReader()
    name: str | None = None
    line: int = 0
    off_endpoint: tuple[int, Endpoint] | None = None  # the first line asking for another, and what

    def parse(self, obj: dict, line_no: int, index: int) -> tuple[RequestSpec, ...]:
        """The line's requests: one per choice it asks for."""
        line_form = "openai" if OPENAI_ENVELOPE_KEYS & obj.keys() - {"custom_id"} else "simple"
        if self.name is None:
            self.name, self.line = line_form, line_no
        elif line_form != self.name:
            raise InputError(f"mixes the {line_form} form with the {self.name} form of line {self.line}; "
                             "use one form per file")
        if line_form == "openai":
            specs = _parse_openai(obj, self.limits, self.default_max_tokens, self.reader)
        else:
            specs = _parse_simple(obj, self.limits, self.default_max_tokens, index, self.reader)
        asked = specs[0].endpoint
        if self.endpoint not in (None, asked) and self.off_endpoint is None:
            self.off_endpoint = (line_no, asked)
        return specs


def _parse_simple(obj: dict, limits: InputLimits, default_max_tokens: int, index: int, reader: _BodyReader
                  ) -> tuple[RequestSpec, ...]:
    """A simple line: a request body of its own, plus an optional custom_id."""
    custom_id = _custom_id(obj["custom_id"], limits) if "custom_id" in obj else f"request-{index}"
    body = {k: v for k, v in obj.items() if k != "custom_id"}
    has_prompt, has_messages = "prompt" in body, "messages" in body
    if has_prompt and has_messages:
        raise InputError("give either 'prompt' or 'messages', not both", "prompt")
    if not has_prompt and not has_messages:
        raise InputError("missing: give 'prompt' (text) or 'messages' (chat)", "prompt")
    endpoint = Endpoint.COMPLETIONS if has_prompt else Endpoint.CHAT
    return _body_specs(endpoint, body, limits, default_max_tokens, custom_id, "", reader)


def _parse_openai(obj: dict, limits: InputLimits, default_max_tokens: int, reader: _BodyReader
                  ) -> tuple[RequestSpec, ...]:
    for key in obj:
        if key not in OPENAI_ENVELOPE_KEYS:
            what = "unknown field" if key else 'unknown field: the empty name ""'
            raise InputError(f"{what} (accepted: {', '.join(sorted(OPENAI_ENVELOPE_KEYS))})", key)
    for key in ("custom_id", "method", "url", "body"):
        if key not in obj:
            raise InputError("missing (required in the OpenAI batch form)", key)
    custom_id = _custom_id(obj["custom_id"], limits)
    if obj["method"] != "POST":
        raise InputError(f'unsupported method {shown(obj["method"])}; only "POST"', "method")
    try:
        endpoint = Endpoint(obj["url"])
    except ValueError:
        raise InputError(
            f'unsupported url {shown(obj["url"])}; use "/v1/completions" or "/v1/chat/completions"', "url",
        ) from None
    body = obj["body"]
    if not isinstance(body, dict):
        raise InputError(f"must be an object, got {json_type(body)}", "body")
    return _body_specs(endpoint, body, limits, default_max_tokens, custom_id, "body.", reader)


def _body_specs(endpoint: Endpoint, body: dict, limits: InputLimits, default_max_tokens: int,
                custom_id: str, prefix: str, reader: _BodyReader) -> tuple[RequestSpec, ...]:
    try:
        return parse_body(endpoint, body, limits, default_max_tokens, custom_id, thinking=reader.thinking,
                          tenant=reader.tenant, tool_parser=reader.tool_parser).specs
    except InputError as exc:
        raise InputError(exc.message, f"{prefix}{exc.field}" if exc.field else None) from None


def _custom_id(value: Any, limits: InputLimits) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"must be a non-empty string, got {json_type(value)}", "custom_id")
    if len(value) > limits.max_custom_id_chars:
        raise InputError(f"longer than {limits.max_custom_id_chars} characters", "custom_id")
    try:
        return storable(value)
    except InputError as exc:
        raise InputError(exc.message, "custom_id") from None
