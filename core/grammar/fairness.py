"""Which waiting grammar job a free worker takes next: the tenants in turn, each tenant's jobs in order.

Pure policy (the pool is the mechanism): one queue a tenant, and the tenants with jobs waiting in a
ring. A free worker takes the first job of the tenant at the ring's head, and that tenant goes to the
ring's end; so a tenant with many expensive schemas waiting delays another tenant's check by one of
them at most (besides the jobs already running), never by its whole queue. A tenant may have at most
`per_tenant` jobs waiting: beyond, `push` refuses (the caller answers without compiling).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class TenantQueueFull(Exception):
    """The tenant already has its most jobs waiting."""


class FairQueue(Generic[T]):
    def __init__(self, per_tenant: int):
        if per_tenant < 1:
            raise ValueError("per_tenant must be at least 1")
        self.per_tenant = per_tenant
        self._waiting: dict[str, deque[T]] = {}
        self._ring: deque[str] = deque()  # tenants with jobs waiting, the next to be served first

    def push(self, tenant: str, job: T) -> None:
        jobs = self._waiting.get(tenant)
        if jobs is None:
            jobs = self._waiting[tenant] = deque()
            self._ring.append(tenant)
        elif len(jobs) >= self.per_tenant:
            raise TenantQueueFull(tenant)
        jobs.append(job)

    def pop(self) -> T | None:
        """The next job to run (None: none waits)."""
        if not self._ring:
            return None
        tenant = self._ring.popleft()
        jobs = self._waiting[tenant]
        job = jobs.popleft()
        if jobs:
            self._ring.append(tenant)
        else:
            del self._waiting[tenant]
        return job

    def remove(self, tenant: str, job: T) -> None:
        """Take back a job that no longer waits (its caller gave up)."""
        jobs = self._waiting.get(tenant)
        if jobs is None or job not in jobs:
            return
        jobs.remove(job)
        if not jobs:
            del self._waiting[tenant]
            self._ring.remove(tenant)

    def waiting(self, tenant: str) -> int:
        return len(self._waiting.get(tenant, ()))

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self._waiting.values())
