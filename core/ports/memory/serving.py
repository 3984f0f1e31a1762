"""MemoryServingStore: the ServingStore contract in memory: the HTTP server's reads of the rows."""

from __future__ import annotations

from collections.abc import Sequence

from fsched.core.ports.memory.reads import first_tokens, progress_of
from fsched.core.ports.memory.rows import MemoryRows, atomic
from fsched.core.ports.records import FirstTokens, RequestProgress, TenantTotals
from fsched.core.types import RequestClass, RequestStatus


class MemoryServingStore:
    def __init__(self, rows: MemoryRows):
        self.rows = rows

    @atomic
    def progress(self, job_ids: Sequence[int]) -> dict[int, tuple[RequestProgress, ...]]:
        """Each given job's requests (one a choice), by job id, in choice order."""
        out = {}
        for job_id in job_ids:
            job = self.rows.jobs.get(job_id)
            if job is not None:
                rows = sorted(map(self.rows.requests.get, job.request_ids), key=lambda r: (r.choice, r.idx))
                out[job_id] = tuple(map(progress_of, rows))
        return out

    @atomic
    def progress_states(self, job_ids: Sequence[int]) -> dict[int, tuple[tuple[RequestStatus, int], ...]]:
        return {job_id: tuple((p.status, p.num_output_tokens) for p in choices)
                for job_id, choices in self.progress(job_ids).items()}

    @atomic
    def tenant_totals(self) -> list[TenantTotals]:
        totals: dict[tuple[str, RequestClass], list[int]] = {}
        for job in self.rows.jobs.values():
            figures = totals.setdefault((job.tenant, job.request_class), [0] * 5)
            for i, value in enumerate((job.num_output_tokens, job.num_prompt_tokens, job.num_done,
                                       job.num_failed, job.num_cancelled)):
                figures[i] += value
        return [TenantTotals(tenant, request_class, *figures)
                for (tenant, request_class), figures in totals.items()]

    @atomic
    def first_tokens(self, since: float) -> dict[RequestClass, FirstTokens]:
        return first_tokens(self.rows, since)

