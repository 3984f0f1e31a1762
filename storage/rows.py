"""What both stores share about rows: the tables, the job-state sets, the
unfinished-work expressions, the row -> record mappers, and the one place a
request id changes type (the core's text id, the table's integer key).
"""

from __future__ import annotations

from fsched.core.jobs.jobstate import JobCounts, JobSummary
from fsched.core.ports.records import ClaimedRequest, RequestProgress, RequestResult, StoreError
from fsched.core.types import (
    AnswerOptions,
    JobOrigin,
    JobState,
    RequestClass,
    RequestId,
    RequestState,
    TokenLogprobs,
)
from fsched.storage.models import DaemonHeartbeat, DaemonUsage, Job, Request, Tenant

jobs = Job.__table__
requests = Request.__table__
tenants = Tenant.__table__
daemons = DaemonHeartbeat.__table__
daemon_usage = DaemonUsage.__table__

FINISHED_JOB_STATES = [s.value for s in JobState if s.finished]
WAITING_REQUEST_STATES = [RequestState.QUEUED.value, RequestState.PREEMPTED.value]

# A job's requests not yet ended (waiting or running), and those of them waiting:
# read from the job's counters, never by counting request rows.
UNFINISHED = jobs.c.num_requests - jobs.c.num_done - jobs.c.num_failed - jobs.c.num_cancelled
WAITING = UNFINISHED - jobs.c.num_running


def row_id(request_id: RequestId) -> int:
    """The table's key of a core request id; StoreError for one that cannot be a key."""
    try:
        return int(request_id)
    except (TypeError, ValueError):
        raise StoreError(f"no request with id {request_id!r}") from None


def core_id(key: int) -> RequestId:
    """The core's id of a request row."""
    return str(key)


def job_counts(job) -> JobCounts:
    return JobCounts(
        num_requests=job.num_requests,
        num_done=job.num_done,
        num_failed=job.num_failed,
        num_cancelled=job.num_cancelled,
        num_running=job.num_running,
    )


def job_summary(row) -> JobSummary:
    return JobSummary(
        id=row.id,
        tenant=row.tenant,
        request_class=RequestClass(row._mapping["class"]),
        priority=row.priority,
        name=row.name,
        state=JobState(row.state),
        counts=job_counts(row),
        num_output_tokens=row.num_output_tokens,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        origin=JobOrigin(row.origin),
        key_id=row.key_id,
    )


# What a reader of a request's output reads of its row (`request_progress`).
PROGRESS_COLUMNS = (
    requests.c.id, requests.c.job_id, requests.c.state, requests.c.output_text, requests.c.num_output_tokens,
    requests.c.prompt_tokens, requests.c.finish_reason, requests.c.error, requests.c.model,
    requests.c.enqueued_at, requests.c.first_token_at, requests.c.finished_at, requests.c.output_logprobs,
    requests.c.choice, requests.c.output_tokens,
)


def request_progress(row) -> RequestProgress:
    """A row of `PROGRESS_COLUMNS` as its readers see it (the HTTP answers, `fsched generate`)."""
    return RequestProgress(
        id=core_id(row.id), job_id=row.job_id, state=RequestState(row.state), output_text=row.output_text,
        num_output_tokens=row.num_output_tokens, enqueued_at=row.enqueued_at,
        first_token_at=row.first_token_at, finished_at=row.finished_at, finish_reason=row.finish_reason,
        error=row.error, prompt_tokens=row.prompt_tokens, model=row.model,
        logprobs=logprobs_of(row.output_logprobs), choice=row.choice, tokens=tuple(row.output_tokens or ()),
    )


def request_result(row) -> RequestResult:
    return RequestResult(
        id=core_id(row.id),
        idx=row.idx,
        custom_id=row.custom_id,
        endpoint=row.endpoint,
        state=RequestState(row.state),
        model=row.model,
        output_text=row.output_text,
        num_output_tokens=row.num_output_tokens,
        prompt_tokens=row.prompt_tokens,
        finish_reason=row.finish_reason,
        error=row.error,
        finished_at=row.finished_at,
        logprobs=logprobs_of(row.output_logprobs),
        choice=row.choice,
        answer=AnswerOptions.from_json(row.answer),
        prompt=row.prompt,
        output_tokens=tuple(row.output_tokens or ()),
    )


def claimed_request(row) -> ClaimedRequest:
    """A request row as its claim returns it: the lease epoch and attempts after the claim."""
    return ClaimedRequest(
        id=core_id(row.id),
        job_id=row.job_id,
        tenant=row.tenant,
        request_class=RequestClass(row.request_class),
        priority=row.priority,
        custom_id=row.custom_id,
        endpoint=row.endpoint,
        prompt=row.prompt,
        messages=row.messages,
        render=row.render,
        params=row.params,
        output_tokens=list(row.output_tokens or []),
        enqueued_at=row.enqueued_at,
        attempts=row.attempts + 1,
        lease_epoch=row.lease_epoch + 1,
        output_logprobs=logprobs_of(row.output_logprobs),
    )


def logprobs_of(stored: list | None) -> tuple[TokenLogprobs, ...]:
    """A logprobs column's records (none when the request asked for none)."""
    return tuple(TokenLogprobs.from_json(t) for t in stored) if stored else ()


def logprobs_json(logprobs: tuple[TokenLogprobs, ...]) -> list | None:
    """What the logprobs column stores: NULL for a request that asked for none."""
    return [t.to_json() for t in logprobs] if logprobs else None
