"""A job's state as a pure function of its request counters, and a job as the table reports it."""

from __future__ import annotations

from dataclasses import dataclass

from fsched.core.types import JobOrigin, JobState, RequestClass


@dataclass(slots=True, frozen=True)
class JobCounts:
    num_requests: int
    num_done: int = 0
    num_failed: int = 0
    num_cancelled: int = 0
    num_running: int = 0

    @property
    def num_finished(self) -> int:
        return self.num_done + self.num_failed + self.num_cancelled

    @property
    def num_waiting(self) -> int:
        """Queued or preempted: requests that still wait for the engine."""
        return self.num_requests - self.num_finished - self.num_running


def derive_job_state(counts: JobCounts, started: bool, cancel_requested: bool) -> JobState:
    """The state a job is in, given what its requests did.

    A job whose requests all failed is `failed`; one with any success is
    `completed` (its failures are listed by `fsched results --errors`), as in
    the OpenAI batch API. A cancel that still waits for running requests to
    stop reads `cancelling`.
    """
    if counts.num_finished >= counts.num_requests:
        if cancel_requested:
            return JobState.CANCELLED
        if counts.num_done == 0 and counts.num_failed > 0:
            return JobState.FAILED
        return JobState.COMPLETED
    if cancel_requested:
        return JobState.CANCELLING
    if started or counts.num_running or counts.num_finished:
        return JobState.IN_PROGRESS
    return JobState.QUEUED


@dataclass(slots=True, frozen=True)
class JobSummary:
    """A job as the job table reports it: its file, how it runs, its counters and times."""

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
    origin: JobOrigin = JobOrigin.SUBMIT  # the door it came in by
    key_id: str | None = None  # the API key it came with (online requests, batches)
