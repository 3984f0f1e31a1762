"""A daemon's leases: renewed once part of them has passed; a request whose lease was lost is dropped.

A lease lost means another daemon may already be running the request under
a higher lease epoch: this daemon stops it in its engine and writes nothing more
for it (the queue would refuse the writes anyway; dropping saves the work).

Renewing costs one row write per lease, so a lease is renewed only once
`renew_after` of it has passed (checked every heartbeat), not every heartbeat:
with the default quarter, a lease is renewed at most a quarter plus a heartbeat
old, so a live daemon keeps more than a quarter of its lease in hand
(`lease_s` > two heartbeats) while writing a few times fewer rows. A killed
daemon's leases expire no later than `lease_s` after its kill, as before.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping

from fsched.core.daemon.engine import Engine
from fsched.core.daemon.holdings import Holdings
from fsched.core.ports.queue import QueueStore
from fsched.core.types import RequestId

log = logging.getLogger("fsched.daemon")

RENEW_AFTER = 0.25  # of lease_s: see the module's docstring


def due_leases(renewed_at: Mapping[RequestId, float], now: float, lease_s: float,
               renew_after: float = RENEW_AFTER) -> set[RequestId]:
    """The leases to renew now: those last extended `renew_after` x `lease_s` ago or longer
    (a stall past that shows them all due, so the next renewal finds what was lost)."""
    cutoff = now - renew_after * lease_s
    return {request_id for request_id, at in renewed_at.items() if at <= cutoff}


class LeaseKeeper:
    def __init__(self, store: QueueStore, engine: Engine, owner: str, lease_s: float, holdings: Holdings,
                 pending: Callable[[], dict[RequestId, int]], renew_after: float = RENEW_AFTER):
        self.store = store
        self.engine = engine
        self.owner = owner
        self.lease_s = lease_s
        self.renew_after = renew_after
        self.holdings = holdings
        self.pending = pending  # leases of completions not yet written: renewed too
        self.lost = 0
        # (request, lease epoch) -> when this daemon last knew the lease extended, by its clock,
        # read before the write (so never later than the table's own time for it).
        self._renewed: dict[tuple[RequestId, int], float] = {}
        self._last_pass = -math.inf  # a lease first seen was claimed since the last pass

    def renew(self, now: float) -> None:
        """Extend the leases due (see `due_leases`); drop, without writing, the requests it lost."""
        leases = self.holdings.leases() | self.pending()
        known = self._renewed
        self._renewed = {key: known.get(key, self._last_pass) for key in leases.items()}
        self._last_pass = now
        renewed_at = {request_id: at for (request_id, _), at in self._renewed.items()}
        due = due_leases(renewed_at, now, self.lease_s, self.renew_after)
        if not due:
            return
        kept = self.store.renew_leases(self.owner, {rid: leases[rid] for rid in due}, self.lease_s)
        for request_id in kept:
            self._renewed[(request_id, leases[request_id])] = now
        lost = due - kept
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
