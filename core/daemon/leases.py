"""A daemon's leases: renewed every heartbeat; a request whose lease was lost is dropped unwritten.

A lease lost means another daemon may already be running the request under
a higher epoch: this daemon stops it in its engine and writes nothing more
for it (the queue would refuse the writes anyway; dropping saves the work).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from fsched.core.daemon.engine import Engine
from fsched.core.daemon.holdings import Holdings
from fsched.core.ports.queue import QueueStore
from fsched.core.types import RequestId

log = logging.getLogger("fsched.daemon")


class LeaseKeeper:
    def __init__(self, store: QueueStore, engine: Engine, owner: str, lease_s: float, holdings: Holdings,
                 pending: Callable[[], dict[RequestId, int]]):
        self.store = store
        self.engine = engine
        self.owner = owner
        self.lease_s = lease_s
        self.holdings = holdings
        self.pending = pending  # leases of completions not yet written: renewed too
        self.lost = 0

    def renew(self) -> None:
        """Extend this daemon's leases; drop, without writing, the requests it lost."""
        leases = self.holdings.leases() | self.pending()
        kept = self.store.renew_leases(self.owner, leases, self.lease_s)
        lost = set(leases) - kept
        if lost:
            self.drop(lost)
            log.warning("lost the lease of %d request(s) (this daemon stalled past its lease); "
                        "another daemon resumes them", len(lost))

    def drop(self, request_ids: Iterable[RequestId]) -> None:
        """Stop held requests in the engine and forget them."""
        for request_id in request_ids:
            if self.holdings.pop(request_id) is not None:
                self.engine.cancel(request_id)
                self.lost += 1

    def reclaim_expired(self) -> None:
        """Requeue any daemon's expired leases (it died or stalled): a shared queue's sweep."""
        reclaimed = self.store.reclaim_expired()
        if reclaimed:
            log.warning("requeued %d request(s) whose lease expired (a daemon died or stalled)", reclaimed)
