"""ServingStore: the reads the HTTP server makes of the job table beyond the catalog's.

What every implementation must hold:

1. **One read for every open request.** `progress` answers all the jobs a
   server process waits on in one short read, whatever their number: a poll
   costs the same for one stream as for hundreds.
2. **Online requests are one-row jobs.** A job's progress is that of its
   first request; a job id with no row is absent from the answer.
3. **Totals over the whole table.** `generated_tokens` counts every job the
   table holds, finished or not, so the counter it feeds never goes down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from fsched.core.jobs.openai import OnlineProgress


@runtime_checkable
class ServingStore(Protocol):
    def progress(self, job_ids: Sequence[int]) -> dict[int, OnlineProgress]:
        """The first request of each given job, by job id."""
        ...

    def generated_tokens(self) -> list[tuple[str, str, int]]:
        """(tenant, class, output tokens so far) over every job the table holds."""
        ...
