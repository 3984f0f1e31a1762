"""Reads the HTTP server makes of the job table: its online requests' progress, and metric totals.

One query answers every request a server process is waiting on, so a poll
costs one short read whatever the number of open streams.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select

from fsched.core.ports.records import FirstTokens, RequestProgress, TenantTotals
from fsched.core.types import RequestClass
from fsched.storage.activity import first_tokens
from fsched.storage.db import Database
from fsched.storage.rows import PROGRESS_COLUMNS, jobs, request_progress, requests


class SqlServingStore:
    def __init__(self, db: Database):
        self.db = db

    def progress(self, job_ids: Sequence[int]) -> dict[int, tuple[RequestProgress, ...]]:
        """Each given job's requests (an online request is a job of one row a choice), by job id,
        in choice order."""
        if not job_ids:
            return {}
        with self.db.read() as conn:
            rows = conn.execute(
                select(*PROGRESS_COLUMNS).where(requests.c.job_id.in_(list(job_ids)))
                .order_by(requests.c.job_id, requests.c.choice)
            ).all()
        out: dict[int, list[RequestProgress]] = {}
        for row in rows:
            out.setdefault(row.job_id, []).append(request_progress(row))
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
