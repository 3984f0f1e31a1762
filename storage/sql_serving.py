"""Reads the HTTP server makes of the job table: its online requests' progress, and metric totals.

One query answers every request a server process is waiting on, so a poll
costs one short read whatever the number of open streams.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select

from fsched.core.ports.records import FirstTokens, OnlineProgress, TenantTotals
from fsched.core.types import RequestClass, RequestState
from fsched.storage.activity import first_tokens
from fsched.storage.db import Database
from fsched.storage.models import Job, Request
from fsched.storage.rows import core_id, logprobs_of

jobs = Job.__table__
requests = Request.__table__
PROGRESS_COLUMNS = (
    requests.c.id, requests.c.job_id, requests.c.state, requests.c.output_text, requests.c.num_output_tokens,
    requests.c.prompt_tokens, requests.c.finish_reason, requests.c.error, requests.c.model,
    requests.c.enqueued_at, requests.c.first_token_at, requests.c.finished_at, requests.c.output_logprobs,
    requests.c.choice, requests.c.output_tokens,
)


class SqlServingStore:
    def __init__(self, db: Database):
        self.db = db

    def progress(self, job_ids: Sequence[int]) -> dict[int, tuple[OnlineProgress, ...]]:
        """Each given job's requests (an online request is a job of one row a choice), by job id,
        in choice order."""
        if not job_ids:
            return {}
        with self.db.read() as conn:
            rows = conn.execute(
                select(*PROGRESS_COLUMNS).where(requests.c.job_id.in_(list(job_ids)))
                .order_by(requests.c.job_id, requests.c.choice)
            ).all()
        out: dict[int, list[OnlineProgress]] = {}
        for row in rows:
            out.setdefault(row.job_id, []).append(OnlineProgress(
                job_id=row.job_id, request_id=core_id(row.id), state=RequestState(row.state),
                output_text=row.output_text, num_output_tokens=row.num_output_tokens,
                prompt_tokens=row.prompt_tokens, finish_reason=row.finish_reason, error=row.error,
                model=row.model, enqueued_at=row.enqueued_at, first_token_at=row.first_token_at,
                finished_at=row.finished_at, logprobs=logprobs_of(row.output_logprobs),
                choice=row.choice, tokens=tuple(row.output_tokens or ()),
            ))
        return {job_id: tuple(choices) for job_id, choices in out.items()}

    def tenant_totals(self) -> list[TenantTotals]:
        """What each tenant used, by class, over every job the table holds (chargeback): from the
        jobs' counters, so it reads the small jobs table, never the requests."""
        sums = [func.sum(c) for c in (jobs.c.num_output_tokens, jobs.c.num_prompt_tokens, jobs.c.num_done,
                                      jobs.c.num_failed, jobs.c.num_cancelled)]
        with self.db.read() as conn:
            rows = conn.execute(
                select(jobs.c.tenant, jobs.c["class"], *sums).group_by(jobs.c.tenant, jobs.c["class"])
            ).all()
        return [TenantTotals(row[0], RequestClass(row[1]), *(int(v or 0) for v in row[2:])) for row in rows]

    def first_tokens(self, since: float) -> dict[RequestClass, FirstTokens]:
        """First-token latency by class of the requests whose first token came after `since` (an index
        range: the cost follows the window, not the table)."""
        return first_tokens(self.db, since)
