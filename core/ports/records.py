"""The records the job store hands back and takes, and the errors any store raises.

Shared by both sides of the store: the queue the daemons serve
(`queue.QueueStore`) and the catalog the commands read and change
(`catalog.CatalogStore`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from fsched.core.sched.explain import RequestStanding
from fsched.core.types import (
    AnswerOptions,
    JobOrigin,
    JobState,
    RequestClass,
    RequestId,
    RequestSpec,
    RequestStatus,
    TokenLogprobs,
)

# A daemon silent for longer than its lease (or this, for one whose heartbeat does not say) is
# dead: its leases are expiring, and other daemons take its work over.
DAEMON_DEAD_AFTER_S = 15.0


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


class UnknownKey(StoreError):
    def __init__(self, key_id: str):
        super().__init__(f"no API key with id {key_id!r}")


class TenantBusy(StoreError):
    """A tenant with unfinished jobs cannot be removed."""


class FileQuotaExceeded(StoreError):
    """An upload, or a batch's rows, would take a tenant's stored bytes over its quota; nothing was
    stored."""

    def __init__(self, tenant: str, used: int, adding: int, quota: int, what: str = "upload"):
        if what == "batch":
            super().__init__(
                f"tenant {tenant!r} stores {used:,} bytes (uploads and batches not yet reclaimed); this "
                f"batch's requests would store {adding:,} bytes more, {used + adding - quota:,} past its "
                f"quota of {quota:,} bytes (max_file_bytes_per_tenant); delete files, or wait until ended "
                "batches are reclaimed (batch_retention_s after they end)"
            )
        else:
            super().__init__(
                f"tenant {tenant!r} stores {used:,} bytes (uploads and batches not yet reclaimed); this "
                f"upload of {adding:,} bytes or more "
                f"would pass its quota of {quota:,} bytes (max_file_bytes_per_tenant); delete files to "
                "make room"
            )
        self.tenant, self.used, self.adding, self.quota, self.what = tenant, used, adding, quota, what


class QueueFull(StoreError):
    """A submit would take a tenant's unfinished requests over the limit; nothing was stored."""

    def __init__(self, tenant: str, unfinished: int, adding: int, limit: int):
        super().__init__(
            f"tenant {tenant!r} has {unfinished:,} unfinished request(s); {adding:,} more would go "
            f"over the limit of {limit:,} a tenant (FSCHED_MAX_QUEUED_PER_TENANT); nothing was submitted"
        )
        self.tenant = tenant


class KeyRevoked(StoreError):
    """A submission's API key is revoked (or not in the table) as its job was to be stored; nothing was
    stored. A server that trusted its memory of the key (api/state.py) learns it here."""

    def __init__(self, key_id: str):
        super().__init__(f"API key {key_id} is revoked or unknown; nothing was submitted")
        self.key_id = key_id


class SchemaMismatch(StoreError):
    """The database was written by another version of fsched."""


@dataclass(slots=True, frozen=True)
class JobSubmission:
    """A job as it is stored: its requests (a submitted file's lines, an online request's choices, each
    one row), whose they are and how they run. What `fsched submit`, the Batch API and an online
    request parse is this, and the catalog stores it as it is."""

    requests: tuple[RequestSpec, ...]
    tenant: str
    request_class: RequestClass
    priority: int
    name: str
    origin: JobOrigin = JobOrigin.SUBMIT
    key_id: str | None = None  # the API key it came with (online requests, batches)

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
class LimitsRead:
    """The limits an admin stored and the rate limits on some keys, read at once
    (`KeyStore.stored_and_rate_limits`)."""

    stored: dict[str, int]  # as `stored_limits`
    rate_limits: dict[str, dict[str, int]]  # each key asked for -> as `rate_limits`


@dataclass(slots=True, frozen=True)
class TenantSummary:
    name: str
    weight: float
    active_jobs: int
    queued: int
    running: int


@dataclass(slots=True, frozen=True)
class DaemonStats:
    """What a daemon publishes with each heartbeat: its engine figures, as `fsched status`, `/metrics`
    and the HTTP server read them.

    Written in one place (the daemon loop); stored as the JSON of `to_json`, whose keys are those
    `fsched status --json` shows under a daemon's `stats`. A row written by an older daemon reads
    back with the defaults for what it did not publish.
    """

    policy: str = ""
    steps: int = 0  # engine steps since the daemon started
    tokens: int = 0  # tokens generated since the daemon started
    tok_s: float = 0.0  # decayed average
    step_ms: float = 0.0  # decayed average
    batch: int = 0  # requests in the last step
    running: int = 0
    waiting: int = 0
    held: int = 0  # requests claimed from the table and not yet written back whole
    kv_tokens: int = 0  # KV cache in use when the heartbeat was made
    kv_budget: int = 0
    served_share: Mapping[str, float] = field(default_factory=dict)  # recent, sums to 1
    weights: Mapping[str, float] = field(default_factory=dict)  # as last applied
    weights_applied_at: float | None = None
    lease_s: float | None = None  # how long its leases last: silent longer than this, it is dead
    fenced_writes: int = 0  # writes the table refused: leases it had lost
    lost_leases: int = 0  # held requests dropped because another claim took them
    preemptions: int = 0  # since the daemon started
    # {tenant: {class: [first tokens, of them within the class's target]}} since the daemon started
    first_tokens: Mapping[str, Mapping[str, list[int]]] = field(default_factory=dict)
    tokens_computed: int = 0  # since the daemon started: every prefill and decode token
    tokens_recomputed: int = 0  # KV dropped by preemptions (prefilled again)
    tokens_parked: int = 0  # KV copied to the host by preemptions
    requests: tuple[RequestStanding, ...] = ()  # running ones first, then waiting in admission order
    link: str | None = None  # host:port where HTTP servers reach it for pushed wake-ups and tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "steps": self.steps, "tokens": self.tokens, "tok_s": self.tok_s,
            "step_ms": self.step_ms, "batch": self.batch, "running": self.running, "waiting": self.waiting,
            "held": self.held, "kv_tokens": self.kv_tokens, "kv_budget": self.kv_budget,
            "served_share": dict(self.served_share), "weights": dict(self.weights),
            "weights_applied_at": self.weights_applied_at, "lease_s": self.lease_s,
            "fenced_writes": self.fenced_writes, "lost_leases": self.lost_leases,
            "preemptions": self.preemptions,
            "first_tokens": {t: dict(c) for t, c in self.first_tokens.items()},
            "tokens_computed": self.tokens_computed, "tokens_recomputed": self.tokens_recomputed,
            "tokens_parked": self.tokens_parked, "requests": [r.to_json() for r in self.requests],
            "link": self.link,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DaemonStats:
        known = {name: data[name] for name in _STATS_FIELDS if data.get(name) is not None}
        known["requests"] = tuple(RequestStanding.from_json(r) for r in data.get("requests") or ())
        return cls(**known)


_STATS_FIELDS = tuple(f.name for f in fields(DaemonStats) if f.name != "requests")


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
    stats: DaemonStats
    # Seconds since the heartbeat on the database's clock (set when read
    # back): the daemons' own clocks may disagree, the database's is one.
    heartbeat_age_s: float | None = None

    def heartbeat_age(self, now: float) -> float:
        """Seconds since the last heartbeat, by the database's clock when it gave one."""
        if self.heartbeat_age_s is not None:
            return self.heartbeat_age_s
        return max(0.0, now - self.heartbeat_at)

    def state(self, now: float) -> str:
        """alive, stopped (said goodbye) or dead (silent past its lease: killed, hung, cut off)."""
        if self.stopped_at is not None:
            return "stopped"
        dead_after = self.stats.lease_s or DAEMON_DEAD_AFTER_S
        return "dead" if self.heartbeat_age(now) > dead_after else "alive"

    def alive(self, now: float) -> bool:
        """Whether this daemon serves the table now: the one rule the commands and the server use."""
        return self.state(now) == "alive"


def newest_live_daemon(daemons: Sequence[DaemonSummary], now: float) -> DaemonSummary | None:
    """The live daemon with the newest heartbeat, whose figures a single view shows; None if none is."""
    alive = [d for d in daemons if d.alive(now)]
    return max(alive, key=lambda d: d.heartbeat_at) if alive else None


@dataclass(slots=True, frozen=True)
class CancelOutcome:
    job_id: int
    state: JobState
    cancelled_now: int  # waiting requests cancelled at once
    stopping: int  # running requests the daemon stops at its next step
    already_finished: bool


@dataclass(slots=True, frozen=True)
class RequestProgress:
    """One request as a reader of its output sees it, while it runs and once it ended: what the HTTP
    answers and streams, `fsched generate` and the daemon's link (pushed text) all read."""

    id: RequestId
    job_id: int
    status: RequestStatus
    output_text: str
    num_output_tokens: int
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None
    error: str | None
    prompt_tokens: int | None = None  # once the engine measured the prompt
    model: str | None = None  # the model that answered
    # One per output token so far when the request asked for logprobs; empty otherwise.
    logprobs: tuple[TokenLogprobs, ...] = ()
    choice: int = 0  # the choice's index within its line (an online request's choices are one job)
    tokens: tuple[int, ...] = ()  # the output token ids so far

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    @property
    def visible_text(self) -> str:
        """The text a reader may see now: a token may end inside a multi-byte character, which
        decodes as U+FFFD until the next token completes it, so such a tail waits for the end.
        Every streamed text (the HTTP API's, `fsched generate --stream`'s) is shown through this."""
        if self.status.is_finished:
            return self.output_text
        return self.output_text.rstrip("\ufffd")


@dataclass(slots=True, frozen=True)
class RequestTiming:
    """A request's timestamps and size, for latency summaries (first token - enqueued)."""

    id: RequestId
    job_id: int
    tenant: str
    request_class: RequestClass
    status: RequestStatus
    num_output_tokens: int
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None


@dataclass(slots=True, frozen=True)
class Completion:
    """A request's end: final state and output, written in one transaction."""

    request_id: RequestId
    status: RequestStatus  # a finished one
    output_tokens: tuple[int, ...] = ()
    output_text: str = ""
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
    # How many leading characters of `text` the table holds already, as the writer's last write left them
    # (the store then writes only the rest); None: the writer does not know, and the text goes whole.
    text_kept: int | None = None


@dataclass(slots=True, frozen=True)
class FirstTokens:
    """First-token latency (enqueued to first token) of one class's requests over a window."""

    count: int
    p50_s: float | None
    p99_s: float | None


@dataclass(slots=True, frozen=True)
class OnlineGroup:
    """One tenant's online requests made with one API key (None: `fsched generate`), in aggregate:
    what a listing shows instead of one line per request."""

    tenant: str
    key_id: str | None
    requests: int  # ever made
    in_flight: int  # not finished yet
    done: int
    failed: int
    cancelled: int
    generated_tokens: int
    last_at: float  # the newest one's submission
    # First-token latency of those whose first token came within the window asked for.
    recent: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None


@dataclass(slots=True, frozen=True)
class TenantTotals:
    """What one tenant's jobs of one class used, over the table's whole history (chargeback)."""

    tenant: str
    request_class: RequestClass
    generated_tokens: int
    prompt_tokens: int  # of the requests that ended with a measured prompt
    done: int
    failed: int
    cancelled: int


@dataclass(slots=True, frozen=True)
class PeerUsage:
    """Another daemon's decayed usage of one tenant, as it last published it."""

    daemon: str
    tenant: str
    gpu_s: float
    kv_token_s: float
    age_s: float  # since it was published, on the database's clock


@dataclass(slots=True, frozen=True)
class RequestResult:
    """A finished request (one choice of a line) as the job table reports it: what its output line
    is made of."""

    id: RequestId
    idx: int
    custom_id: str
    endpoint: str
    status: RequestStatus
    model: str | None
    output_text: str
    num_output_tokens: int
    prompt_tokens: int | None
    error: str | None
    finished_at: float | None
    # One per output token when the request asked for logprobs; empty otherwise.
    logprobs: tuple[TokenLogprobs, ...] = ()
    choice: int = 0  # the choice's index within its line
    answer: AnswerOptions = AnswerOptions()
    prompt: str | None = None  # a completions request's prompt (echo shows it)
    output_tokens: tuple[int, ...] = ()

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason
