"""Domain vocabulary shared by every layer: classes, states, sampling parameters.

Pure data, no I/O. The job table (storage), the scheduler and the engine all
speak in these types; strings appear only at the edges (JSON, SQL columns).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

# A request's id everywhere in fsched: the job table's key, as text. The
# scheduler, the engine, the runners, the records and the API key requests by
# it; storage converts it to and from its integer column at its own boundary
# (storage/rows.py), and nowhere else.
RequestId = str


class RequestClass(enum.StrEnum):
    """Service class of a job; its band order is realtime < streaming < batch."""

    REALTIME = "realtime"
    STREAMING = "streaming"
    BATCH = "batch"

    @property
    def band(self) -> int:
        """The class's precedence: 0 is served first."""
        return _BANDS[self]


_BANDS = {RequestClass.REALTIME: 0, RequestClass.STREAMING: 1, RequestClass.BATCH: 2}


class JobState(enum.StrEnum):
    """A job's life, in the OpenAI batch vocabulary where it fits."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in _FINISHED_JOB_STATES


_FINISHED_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class JobOrigin(enum.StrEnum):
    """Which door a job came in by: listings show submitted files and batches as jobs, and the
    one-request jobs of online requests and `fsched generate` grouped apart."""

    SUBMIT = "submit"  # fsched submit: a file
    BATCH = "batch"  # the Batch API: an uploaded file
    ONLINE = "online"  # /v1/completions, /v1/chat/completions: one request
    GENERATE = "generate"  # fsched generate: one prompt

    @property
    def interactive(self) -> bool:
        """One request someone waits on, rather than a file of work."""
        return self in (JobOrigin.ONLINE, JobOrigin.GENERATE)


class RequestState(enum.StrEnum):
    """A request's life. `preempted` waits again, holding its tokens so far."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in _FINISHED_REQUEST_STATES

    @property
    def waiting(self) -> bool:
        return self in (RequestState.QUEUED, RequestState.PREEMPTED)


_FINISHED_REQUEST_STATES = frozenset({RequestState.DONE, RequestState.FAILED, RequestState.CANCELLED})


class Endpoint(enum.StrEnum):
    """Which OpenAI response shape a request's result takes."""

    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


MAX_SEED = 2**63 - 1


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to draw tokens. `temperature == 0` means greedy.

    `seed` is always set once a request is stored, so a preempted, recomputed
    or restarted request draws the same tokens.

    `max_tokens_is_default`: the request did not ask for `max_tokens` (a
    default filled it in). The engine then caps it at the room the model's
    context leaves; a `max_tokens` asked for that does not fit is refused
    instead (the OpenAI/vLLM convention).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    max_tokens_is_default: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 2.0):
            raise ValueError("temperature must be within [0, 2]")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be within (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 turns it off)")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be within [0, {MAX_SEED}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_json(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": list(self.stop),
            "max_tokens_is_default": self.max_tokens_is_default,
        }

    @classmethod
    def from_json(cls, data: dict) -> SamplingParams:
        return cls(
            max_tokens=int(data["max_tokens"]),
            temperature=float(data.get("temperature", 1.0)),
            top_p=float(data.get("top_p", 1.0)),
            top_k=int(data.get("top_k", 0)),
            seed=data.get("seed"),
            stop=tuple(data.get("stop", ())),
            # Rows stored before the flag existed were always capped, as now a default is.
            max_tokens_is_default=bool(data.get("max_tokens_is_default", True)),
        )


@dataclass(slots=True, frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(slots=True, frozen=True)
class RequestSpec:
    """One validated input line: what to generate, before it is stored."""

    custom_id: str
    endpoint: Endpoint
    params: SamplingParams
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] = field(default=())
    model: str | None = None  # the name the submitter asked for; echoed in results

    def __post_init__(self) -> None:
        if (self.prompt is None) == (not self.messages):
            raise ValueError("a request has either a prompt or messages, not both")
