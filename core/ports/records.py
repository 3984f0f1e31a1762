"""The records the job store hands back and takes, and the errors any store raises.

Shared by both sides of the store: the queue the daemons serve
(`queue.QueueStore`) and the catalog the commands read and change
(`catalog.CatalogStore`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsched.core.jobs.jobfile import ParsedJobFile
from fsched.core.jobs.jobstate import JobCounts
from fsched.core.types import AnswerOptions, JobState, RequestClass, RequestId, RequestState, TokenLogprobs


class StoreError(Exception):
    """Base of every error a job store raises; its message is fit for a user."""


class StorageError(StoreError):
    """The database cannot be used: locked past the timeout, read-only, full, gone."""


class UnknownJob(StoreError):
    def __init__(self, job_id: int):
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class UnknownTenant(StoreError):
    def __init__(self, name: str):
        super().__init__(f"no tenant named {name!r}")
        self.name = name


class TenantExists(StoreError):
    def __init__(self, name: str):
        super().__init__(f"tenant {name!r} already exists")


class TenantBusy(StoreError):
    """A tenant with unfinished jobs cannot be removed."""


class QueueFull(StoreError):
    """A submit would take a tenant's unfinished requests over the limit; nothing was stored."""

    def __init__(self, tenant: str, unfinished: int, adding: int, limit: int):
        super().__init__(
            f"tenant {tenant!r} has {unfinished:,} unfinished request(s); {adding:,} more would go "
            f"over the limit of {limit:,} a tenant (FSCHED_MAX_QUEUED_PER_TENANT); nothing was submitted"
        )
        self.tenant = tenant


class SchemaMismatch(StoreError):
    """The database was written by another version of fsched."""


@dataclass(slots=True, frozen=True)
class JobSubmission:
    """One parsed file and how to run it."""

    parsed: ParsedJobFile
    tenant: str
    request_class: RequestClass
    priority: int
    name: str

    def __post_init__(self) -> None:
        if not 0 <= self.priority <= 9:
            raise ValueError("priority must be within 0..9")


@dataclass(slots=True, frozen=True)
class SubmittedJob:
    job_id: int
    num_requests: int
    tenant: str
    request_class: RequestClass
    tenant_created: bool


@dataclass(slots=True, frozen=True)
class JobSummary:
    id: int
    tenant: str
    request_class: RequestClass
    priority: int
    name: str
    state: JobState
    counts: JobCounts
    num_output_tokens: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None


@dataclass(slots=True, frozen=True)
class TenantSummary:
    name: str
    weight: float
    active_jobs: int
    queued: int
    running: int


@dataclass(slots=True, frozen=True)
class DaemonSummary:
    id: str
    host: str
    pid: int
    device: str
    model: str
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    stats: dict
    # Seconds since the heartbeat on the database's clock (set when read
    # back): the daemons' own clocks may disagree, the database's is one.
    heartbeat_age_s: float | None = None


@dataclass(slots=True, frozen=True)
class CancelOutcome:
    job_id: int
    state: JobState
    cancelled_now: int  # waiting requests cancelled at once
    stopping: int  # running requests the daemon stops at its next step
    already_finished: bool


@dataclass(slots=True, frozen=True)
class RequestResult:
    id: RequestId
    idx: int
    custom_id: str
    endpoint: str
    state: RequestState
    model: str | None
    output_text: str
    num_output_tokens: int
    prompt_tokens: int | None
    finish_reason: str | None
    error: str | None
    finished_at: float | None
    # One per output token when the request asked for logprobs; empty otherwise.
    logprobs: tuple[TokenLogprobs, ...] = ()
    choice: int = 0  # the choice's index within its line
    answer: AnswerOptions = AnswerOptions()
    prompt: str | None = None  # a completions request's prompt (echo shows it)
    output_tokens: tuple[int, ...] = ()


@dataclass(slots=True, frozen=True)
class ClaimedRequest:
    id: RequestId
    job_id: int
    tenant: str
    request_class: RequestClass
    priority: int
    custom_id: str
    endpoint: str
    prompt: str | None
    messages: list | None
    params: dict
    output_tokens: list[int]
    enqueued_at: float
    attempts: int = 1  # claims so far, this one included
    # The fencing token: every write-back names it, and is refused once
    # another claim (after this lease expired) has raised it.
    lease_epoch: int = 0
    # The logprobs of `output_tokens` (when the request asks for them): a resume keeps them.
    output_logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(slots=True, frozen=True)
class RequestProgress:
    """One request as a reader of its output sees it: what `fsched generate` polls."""

    id: RequestId
    job_id: int
    state: RequestState
    output_text: str
    num_output_tokens: int
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None
    finish_reason: str | None
    error: str | None


@dataclass(slots=True, frozen=True)
class RequestTiming:
    """A request's timestamps and size, for latency summaries (first token - enqueued)."""

    id: RequestId
    job_id: int
    tenant: str
    request_class: RequestClass
    state: RequestState
    num_output_tokens: int
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None


@dataclass(slots=True, frozen=True)
class Completion:
    """A request's end: final state and output, written in one transaction."""

    request_id: RequestId
    state: RequestState
    output_tokens: tuple[int, ...] = ()
    output_text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    model: str | None = None
    error: str | None = None
    first_token_at: float | None = None
    lease_epoch: int | None = None  # the writer's lease epoch (None: not fenced by epoch)
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per output token, when asked for


@dataclass(slots=True, frozen=True)
class TokenUpdate:
    """A running request's output so far, to persist."""

    request_id: RequestId
    tokens: tuple[int, ...]
    text: str
    first_token_at: float | None = None
    lease_epoch: int | None = None  # the writer's lease epoch (None: not fenced by epoch)
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token, when the request asks for them


@dataclass(slots=True, frozen=True)
class PeerUsage:
    """Another daemon's decayed usage of one tenant, as it last published it."""

    daemon: str
    tenant: str
    gpu_s: float
    kv_token_s: float
    age_s: float  # since it was published, on the database's clock
