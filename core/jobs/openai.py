"""OpenAI's online API in fsched's terms: request bodies in, response objects and chunks out.

Pure translation, no I/O. A body is checked by the same parser as a line of a
batch file (so `submit`, the Batch API and the online endpoints accept the
same fields), after the fields only online requests have are taken off:
`stream_options`, `service_tier` (the class, never above the key's) and
`priority` (fsched's base priority, 0 most urgent to 9).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsched.core.jobs.apikeys import class_allowed
from fsched.core.jobs.jobfile import JobFileError, load_json_object, parse_openai_body
from fsched.core.jobs.limits import InputLimits
from fsched.core.types import Endpoint, RequestClass, RequestId, RequestSpec, RequestState, TokenLogprobs

# OpenAI's service tiers as fsched's classes; "auto" (or none) is the key's own class.
SERVICE_TIERS = {
    "priority": RequestClass.REALTIME,
    "default": RequestClass.STREAMING,
    "flex": RequestClass.BATCH,
    "auto": None,
}
TIER_OF_CLASS = {
    RequestClass.REALTIME: "priority", RequestClass.STREAMING: "default", RequestClass.BATCH: "flex"
}
DEFAULT_PRIORITY = 5
DEFAULT_MAX_TOKENS = 256
CONTEXT_WORDS = "model's context"  # the engine's words for a request that cannot fit


class BodyError(ValueError):
    """A request body fsched cannot take (HTTP 400); `param` names the field when known."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class ClassRefused(BodyError):
    """A request asked for a class above its key's (HTTP 403)."""


@dataclass(slots=True, frozen=True)
class OnlineRequest:
    spec: RequestSpec
    request_class: RequestClass
    priority: int
    stream: bool
    include_usage: bool


@dataclass(slots=True, frozen=True)
class OnlineProgress:
    """An online request's row as its HTTP handler polls it."""

    job_id: int
    request_id: RequestId
    state: RequestState
    output_text: str
    num_output_tokens: int
    prompt_tokens: int | None
    finish_reason: str | None
    error: str | None
    model: str | None
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None
    # One per output token so far when the request asked for logprobs; empty otherwise.
    logprobs: tuple[TokenLogprobs, ...] = ()


def parse_online(
    text: str, endpoint: Endpoint, key_class: RequestClass, limits: InputLimits = InputLimits()
) -> OnlineRequest:
    """A completions or chat completions body as a request, or BodyError / ClassRefused."""
    try:
        body = load_json_object(text, limits.max_depth)
    except JobFileError as exc:
        raise BodyError(exc.message, exc.field) from None
    stream_options = body.pop("stream_options", None)
    tier = body.pop("service_tier", None)
    priority = body.pop("priority", None)
    request_class = _tier_class(tier, key_class)
    try:
        spec = parse_openai_body(endpoint, body, limits, DEFAULT_MAX_TOKENS)
    except JobFileError as exc:
        raise BodyError(exc.message, exc.field) from None
    stream = bool(body.get("stream"))
    return OnlineRequest(
        spec=spec,
        request_class=request_class,
        priority=_priority(priority),
        stream=stream,
        include_usage=_include_usage(stream_options, stream),
    )


def _tier_class(tier: object, key_class: RequestClass) -> RequestClass:
    if tier is None:
        return key_class
    if not isinstance(tier, str) or tier not in SERVICE_TIERS:
        raise BodyError(f"service_tier must be one of {', '.join(SERVICE_TIERS)}", "service_tier")
    asked = SERVICE_TIERS[tier] or key_class
    if not class_allowed(asked, key_class):
        raise ClassRefused(
            f"service_tier {tier!r} ({asked.value}) is above this key's class ({key_class.value}, "
            f"service_tier {TIER_OF_CLASS[key_class]!r} or lower)",
            "service_tier",
        )
    return asked


def _priority(value: object) -> int:
    if value is None:
        return DEFAULT_PRIORITY
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9:
        raise BodyError("priority must be an integer within 0..9 (0 is the most urgent)", "priority")
    return value


def _include_usage(options: object, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise BodyError("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise BodyError('stream_options must be an object {"include_usage": bool}', "stream_options")
    value = options.get("include_usage", False)
    if not isinstance(value, bool):
        raise BodyError("stream_options.include_usage must be a boolean", "stream_options.include_usage")
    return value


# -- responses ----------------------------------------------------------------------------------


def usage(prompt_tokens: int | None, completion_tokens: int) -> dict:
    prompt = prompt_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def response_id(endpoint: Endpoint, request_id: int) -> str:
    return f"chatcmpl-{request_id}" if endpoint is Endpoint.CHAT else f"cmpl-{request_id}"


def response_body(
    endpoint: Endpoint, request_id: int, created: int, model: str, text: str, finish_reason: str | None,
    prompt_tokens: int | None, completion_tokens: int,
) -> dict:
    """A whole `chat.completion` or `text_completion` object."""
    reason = finish_reason or "stop"
    if endpoint is Endpoint.CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        kind = "text_completion"
    return {"id": response_id(endpoint, request_id), "object": kind, "created": created, "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def chunk(
    endpoint: Endpoint, request_id: int, created: int, model: str, text: str,
    finish_reason: str | None = None, first: bool = False, include_usage: bool = False,
) -> dict:
    """One streamed chunk: new text, or (with `finish_reason`) the last choice chunk.

    With `include_usage` every chunk carries `usage: null` (OpenAI's convention);
    the usage itself comes in a last chunk of its own (`usage_chunk`).
    """
    if endpoint is Endpoint.CHAT:
        delta: dict = {"content": text} if text or not first else {"content": ""}
        if first:
            delta = {"role": "assistant", **delta}
        choice = {"index": 0, "delta": delta if finish_reason is None or text else {}, "logprobs": None,
                  "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    out = {"id": response_id(endpoint, request_id), "object": kind, "created": created, "model": model,
           "choices": [choice]}
    if include_usage:
        out["usage"] = None
    return out


def usage_chunk(endpoint: Endpoint, request_id: int, created: int, model: str, prompt_tokens: int | None,
                completion_tokens: int) -> dict:
    kind = "chat.completion.chunk" if endpoint is Endpoint.CHAT else "text_completion"
    return {"id": response_id(endpoint, request_id), "object": kind, "created": created, "model": model,
            "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def visible_text(progress: OnlineProgress) -> str:
    """The text a reader may see now: a token may end inside a multi-byte character, which
    decodes as U+FFFD until the next token completes it, so such a tail waits for the end."""
    if progress.state.finished:
        return progress.output_text
    return progress.output_text.rstrip("\ufffd")


def failure_status(error: str | None) -> int:
    """The HTTP status of a request the engine refused or failed: a request that cannot fit
    the model's context is the client's to fix (400, as OpenAI and vLLM answer); anything
    else is the server's (500)."""
    return 400 if error and CONTEXT_WORDS in error else 500
