"""What both stores share about rows: the tables, the job-state sets, the
unfinished-work expressions, the row -> record mappers, and the one place a
request id changes type (the core's text id, the table's integer key).
"""

from __future__ import annotations

import enum

from fsched.core.jobs.jobstate import JobCounts, JobSummary
from fsched.core.ports.records import RequestProgress, RequestResult, StoreError
from fsched.core.sched.request import Request
from fsched.core.types import (
    AnswerOptions,
    JobOrigin,
    JobState,
    RequestClass,
    RequestId,
    RequestStatus,
    SamplingParams,
    TokenLogprobs,
)
from fsched.storage.models import DaemonHeartbeat, DaemonUsage, Job, RequestRow, Tenant
from fsched.storage.output import Output, whole_output

jobs = Job.__table__
requests = RequestRow.__table__
tenants = Tenant.__table__
daemons = DaemonHeartbeat.__table__
daemon_usage = DaemonUsage.__table__



class RowState(enum.StrEnum):
    """A request row's `state` column: the words the table stores a `RequestStatus` as (with its
    finish reason in its own column). Mapped here, both ways, and nowhere else."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (RowState.DONE, RowState.FAILED, RowState.CANCELLED)


_ROW_STATES = {
    RequestStatus.WAITING: RowState.QUEUED,
    RequestStatus.RUNNING: RowState.RUNNING,
    RequestStatus.PREEMPTED: RowState.PREEMPTED,
    RequestStatus.FINISHED_STOPPED: RowState.DONE,
    RequestStatus.FINISHED_LENGTH: RowState.DONE,
    RequestStatus.FINISHED_CANCELLED: RowState.CANCELLED,
    RequestStatus.FINISHED_FAILED: RowState.FAILED,
}
_OF_ROW_STATE = {word: status for status, word in _ROW_STATES.items() if word is not RowState.DONE}


def row_state(status: RequestStatus) -> RowState:
    """The state column's word for `status` (its finish reason goes in its own column)."""
    return _ROW_STATES[status]


def status_of_row(state: str, finish_reason: str | None = None) -> RequestStatus:
    """The status a row's state word and finish reason stand for."""
    if state == RowState.DONE:
        return RequestStatus.finished_by(finish_reason)
    return _OF_ROW_STATE[RowState(state)]


FINISHED_JOB_STATES = [s.value for s in JobState if s.finished]
# A filter of unfinished jobs names these states (`state IN`): the state's indexes then read the unfinished
# jobs alone, where `state NOT IN` the finished ones read every job ever submitted (one a streamed chat).
UNFINISHED_JOB_STATES = [s.value for s in JobState if not s.finished]
WAITING_REQUEST_STATES = [RowState.QUEUED.value, RowState.PREEMPTED.value]

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
    requests.c.enqueued_at, requests.c.first_token_at, requests.c.finished_at, requests.c.num_logprobs,
    requests.c.choice, requests.c.output_tokens,
)


def request_progress(row, logprobs: tuple[TokenLogprobs, ...] = (), output: Output | None = None
                     ) -> RequestProgress:
    """A row of `PROGRESS_COLUMNS` and its logprobs as their readers see them (the HTTP answers,
    `fsched generate`); `output`: its token ids and text, where its row holds only part of them."""
    tokens, text = whole_output(row, output)
    return RequestProgress(
        id=core_id(row.id), job_id=row.job_id, status=status_of_row(row.state, row.finish_reason),
        output_text=text,
        num_output_tokens=row.num_output_tokens, enqueued_at=row.enqueued_at,
        first_token_at=row.first_token_at, finished_at=row.finished_at,
        error=row.error, prompt_tokens=row.prompt_tokens, model=row.model,
        logprobs=logprobs, choice=row.choice, tokens=tokens,
    )


def request_result(row, logprobs: tuple[TokenLogprobs, ...] = (), output: Output | None = None
                   ) -> RequestResult:
    """A request's row as results show it; `output`: its token ids and text, where its row holds only part
    of them."""
    tokens, text = whole_output(row, output)
    return RequestResult(
        id=core_id(row.id),
        idx=row.idx,
        custom_id=row.custom_id,
        endpoint=row.endpoint,
        status=status_of_row(row.state, row.finish_reason),
        model=row.model,
        output_text=text,
        num_output_tokens=row.num_output_tokens,
        prompt_tokens=row.prompt_tokens,
        error=row.error,
        finished_at=row.finished_at,
        logprobs=logprobs,
        choice=row.choice,
        answer=AnswerOptions.from_json(row.answer),
        prompt=row.prompt,
        output_tokens=tokens,
    )


def claimed_request(row, logprobs: tuple[TokenLogprobs, ...] = (), job=None,
                    output: Output | None = None) -> Request:
    """A request row (and its logprobs) as its claim returns it: its live record, with the lease epoch
    and attempts after the claim and its prompt as stored (the daemon encodes it). The row as read
    before its lease, with its job's tenant, class and priority; or, given its `job` (those three), the
    row as its lease left it. `output`: its output, where its row holds only part of it."""
    raised = 1 if job is None else 0  # the lease's increments, not yet in a row read before it
    job = row if job is None else job
    return Request.to_run(
        core_id(row.id), (), SamplingParams.from_json(row.params), job.tenant,
        RequestClass(job.request_class), job.priority, list(whole_output(row, output)[0]), logprobs,
        prompt_text=row.prompt, messages=row.messages, render=row.render, job_id=row.job_id,
        custom_id=row.custom_id, enqueued_at=row.enqueued_at, lease_epoch=row.lease_epoch + raised,
        attempts=row.attempts + raised,
    )
