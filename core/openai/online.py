"""An online request (/v1/completions, /v1/chat/completions) in fsched's terms: its body read as the job
the catalog stores, and a finished choice as its answer shows it.

Pure translation, no I/O. A body is checked by the same parser as a line of a
batch file (so `submit`, the Batch API and the online endpoints accept the
same fields), after the fields only online requests have are taken off:
`stream_options`, `service_tier` (the class, never above the key's) and
`priority` (fsched's base priority, 0 most urgent to 9). The answers and
chunks themselves are `answers.py`'s and `streams.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsched.core.jobs.apikeys import ApiKey, class_allowed
from fsched.core.jobs.inputs import InputError
from fsched.core.jobs.jsontext import loads_object
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.answers import AnswerChoice
from fsched.core.openai.body import PromptThinking, parse_body
from fsched.core.openai.toolcalls.families import AUTO
from fsched.core.ports.records import JobSubmission, RequestProgress
from fsched.core.types import Endpoint, JobOrigin, RequestClass, RequestSpec

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
JOB_NAME = "http"  # an online request's job, in listings
CONTEXT_WORDS = "model's context"  # the engine's words for a request that cannot fit


class BodyError(InputError):
    """A request body fsched cannot take (HTTP 400), its message as the answer says it (the field
    first); `field` names the field when known."""


class ClassRefused(BodyError):
    """A request asked for a class above its key's (HTTP 403)."""


@dataclass(slots=True, frozen=True)
class StreamOptions:
    include_usage: bool = False  # a last chunk with the usage (and `usage: null` on the others)
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: the usage so far in every chunk
    obfuscation: bool = False  # OpenAI's include_obfuscation: random padding in every chunk


@dataclass(slots=True, frozen=True)
class OnlineRequest:
    """An online request as its body reads: the job the catalog stores as it is (one row a choice,
    the key's tenant, the class and priority asked for), and how its answer streams."""

    job: JobSubmission
    stream: bool
    stream_options: StreamOptions = StreamOptions()

    @property
    def specs(self) -> tuple[RequestSpec, ...]:
        """The choices, in order."""
        return self.job.requests

    @property
    def spec(self) -> RequestSpec:
        """The first choice: what every choice shares (model, endpoint, answer options)."""
        return self.job.requests[0]

    @property
    def request_class(self) -> RequestClass:
        return self.job.request_class


def choice_of(progress: RequestProgress, prompt: str | None = None) -> AnswerChoice:
    """A finished choice as an answer shows it."""
    return AnswerChoice(index=progress.choice, text=progress.output_text,
                        finish_reason=progress.finish_reason, num_tokens=progress.num_output_tokens,
                        prompt_tokens=progress.prompt_tokens, tokens=progress.tokens,
                        logprobs=progress.logprobs, prompt=prompt)


def parse_online(text: str, endpoint: Endpoint, key: ApiKey, limits: InputLimits = InputLimits(),
                 tool_parser: str = AUTO, thinking: PromptThinking | None = None) -> OnlineRequest:
    """A completions or chat completions body, sent with `key`, as the job to store (one request a
    choice), or BodyError / ClassRefused."""
    try:
        body = loads_object(text, limits.max_depth)
        parsed = parse_body(endpoint, body, limits, limits.default_max_tokens, online=True,
                            tool_parser=tool_parser, thinking=thinking, tenant=key.tenant)
    except InputError as exc:
        raise BodyError(exc.named(), exc.field) from None
    own = parsed.online
    stream = own.get("stream", False)
    job = JobSubmission(parsed.specs, tenant=key.tenant,
                        request_class=_tier_class(own.get("service_tier"), key.request_class),
                        priority=_priority(own.get("priority")), name=JOB_NAME, origin=JobOrigin.ONLINE,
                        key_id=key.id)
    return OnlineRequest(job, stream, _stream_options(own.get("stream_options"), stream))


def _tier_class(tier: str | None, key_class: RequestClass) -> RequestClass:
    if tier is None:
        return key_class
    asked = SERVICE_TIERS[tier] or key_class
    if not class_allowed(asked, key_class):
        raise ClassRefused(
            f"service_tier {tier!r} ({asked.value}) is above this key's class ({key_class.value}, "
            f"service_tier {TIER_OF_CLASS[key_class]!r} or lower)",
            "service_tier",
        )
    return asked


def _priority(value: int | None) -> int:
    """fsched's base priority: 0..9 as asked; vLLM's wider integers (lower is earlier) clamped into it."""
    if value is None:
        return DEFAULT_PRIORITY
    return min(max(value, 0), 9)


def _stream_options(options: dict | None, stream: bool) -> StreamOptions:
    if options is None:
        return StreamOptions()
    if not stream:
        raise BodyError("stream_options: only allowed with stream: true", "stream_options")
    return StreamOptions(
        include_usage=options.get("include_usage", False),
        continuous_usage=options.get("continuous_usage_stats", False),
        obfuscation=options.get("include_obfuscation", False),
    )


def failure_status(error: str | None) -> int:
    """The HTTP status of a request the engine refused or failed: a request that cannot fit
    the model's context is the client's to fix (400, as OpenAI and vLLM answer); anything
    else is the server's (500)."""
    return 400 if error and CONTEXT_WORDS in error else 500
