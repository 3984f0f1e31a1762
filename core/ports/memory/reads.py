"""Rows read back as the records the stores hand out, and the reads of what happened lately.

The memory stores' counterpart of storage/rows.py's mappers and
storage/activity.py's reads: the same records, the same figures (one
percentile definition, the simulator's).
"""

from __future__ import annotations

from collections import defaultdict

from fsched.core.ports.memory.rows import MemoryRequest, MemoryRows
from fsched.core.ports.records import FirstTokens, OnlineGroup, RequestProgress, RequestResult
from fsched.core.sim.metrics import percentile
from fsched.core.types import AnswerOptions, RequestClass

# The window an online group's latency figures cover (as the SQL catalog's).
ONLINE_WINDOW_S = 300.0


def result_of(r: MemoryRequest) -> RequestResult:
    return RequestResult(
        id=r.id, idx=r.idx, custom_id=r.custom_id, endpoint=r.endpoint, status=r.status, model=r.model,
        output_text=r.output_text, num_output_tokens=len(r.output_tokens), prompt_tokens=r.prompt_tokens,
        error=r.error, finished_at=r.finished_at, logprobs=r.output_logprobs,
        choice=r.choice, answer=AnswerOptions.from_json(r.answer), prompt=r.prompt,
        output_tokens=tuple(r.output_tokens),
    )


def progress_of(r: MemoryRequest) -> RequestProgress:
    return RequestProgress(
        id=r.id, job_id=r.job_id, status=r.status, output_text=r.output_text,
        num_output_tokens=len(r.output_tokens), prompt_tokens=r.prompt_tokens,
        error=r.error, model=r.model, enqueued_at=r.enqueued_at, first_token_at=r.first_token_at,
        finished_at=r.finished_at, logprobs=r.output_logprobs, choice=r.choice, tokens=tuple(r.output_tokens),
    )


def _latency(r: MemoryRequest) -> float:
    return max(0.0, r.first_token_at - r.enqueued_at)


def first_tokens(rows: MemoryRows, since: float) -> dict[RequestClass, FirstTokens]:
    """First-token latency by class of the requests whose first token came after `since`."""
    by_class: dict[RequestClass, list[float]] = defaultdict(list)
    for r in rows.requests.values():
        if r.first_token_at is not None and r.first_token_at > since:
            by_class[rows.jobs[r.job_id].request_class].append(_latency(r))
    return {c: FirstTokens(len(v), percentile(v, 50), percentile(v, 99)) for c, v in by_class.items()}


def online_groups(rows: MemoryRows, since: float, tenant: str | None) -> list[OnlineGroup]:
    """Online and `generate` requests per (tenant, key), as storage/activity.py's `online_groups`."""
    jobs = [j for j in rows.jobs.values() if j.origin.interactive and (tenant is None or j.tenant == tenant)]
    groups: dict[tuple[str, str | None], list] = {}
    for job in jobs:
        totals = groups.setdefault((job.tenant, job.key_id), [0] * 7)
        for i, value in enumerate((1, not job.state.finished, job.num_done, job.num_failed, job.num_cancelled,
                                   job.num_output_tokens)):
            totals[i] += value
        totals[6] = max(totals[6], job.submitted_at)
    ttft: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    for job in jobs:
        for r in map(rows.requests.get, job.request_ids):
            if r.first_token_at is not None and r.first_token_at > since:
                ttft[job.tenant, job.key_id].append(_latency(r))
    made = []
    for (name, key), totals in groups.items():
        seen = ttft.get((name, key), [])
        made.append(OnlineGroup(name, key, *(int(v) for v in totals[:6]), last_at=totals[6], recent=len(seen),
                                ttft_p50_s=percentile(seen, 50), ttft_p99_s=percentile(seen, 99)))
    return sorted(made, key=lambda g: (g.tenant, g.key_id or ""))
