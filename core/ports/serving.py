"""ServingStore: the reads the HTTP server makes of the job table beyond the catalog's.

What every implementation must hold:

1. **One read for every open request.** `progress` answers all the jobs a
   server process waits on in one short read, whatever their number: a poll
   costs the same for one stream as for hundreds.
2. **Online requests are one-row jobs.** A job's progress is that of its
   first request; a job id with no row is absent from the answer.
3. **Totals over the whole table.** `tenant_totals` counts every job the
   table holds, finished or not, so the counters it feeds never go down.
4. **States without texts.** `progress_states` answers as `progress` does with
   each request's status and token count only: the check of requests whose
   text a daemon's link pushes reads no text or token ids.
5. **Recent reads cost the window.** `first_tokens` reads the
   requests whose first token came after a time, by index, not the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from fsched.core.ports.records import FirstTokens, RequestProgress, TenantTotals
from fsched.core.types import RequestClass, RequestStatus


@runtime_checkable
class ServingStore(Protocol):
    def progress(self, job_ids: Sequence[int]) -> dict[int, RequestProgress]:
        """The first request of each given job, by job id."""
        ...

    def progress_states(self, job_ids: Sequence[int]) -> dict[int, tuple[tuple[RequestStatus, int], ...]]:
        """Each given job's requests as (status, output tokens), one a choice in choice order, by job id."""
        ...

    def tenant_totals(self) -> list[TenantTotals]:
        """What each tenant used per class (generated and prompt tokens, requests by outcome), over
        every job the table holds."""
        ...

    def first_tokens(self, since: float) -> dict[RequestClass, FirstTokens]:
        """First-token latency (count, p50, p99) by class of the requests whose first token came after
        `since`."""
        ...
