"""SqlQueueStore: the daemons' side of the job table (QueueStore) over SQLAlchemy Core.

Every method is one transaction. Leases and heartbeats are stamped by the
database's clock, so daemons whose clocks disagree still agree on who holds
what. Request ids are the core's text ids outside this module and integer
keys inside it (`rows.row_id`, `rows.core_id`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import Float, Integer, bindparam, case, delete, select, update

from fsched.core.faults import crash_point
from fsched.core.ports.queue import ClaimAsk, StepWritten
from fsched.core.ports.records import (
    Completion,
    DaemonSummary,
    PeerUsage,
    TokenUpdate,
)
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId
from fsched.storage.base import SqlStoreBase
from fsched.storage.claim import Leased, claim_at_once, lease_requests, nothing_to_take
from fsched.storage.counters import CountDelta, move_jobs, requeue
from fsched.storage.db import Database, database_clock
from fsched.storage.direct import DirectConnection
from fsched.storage.prepared import Prepared, listed, statements_of
from fsched.storage.refusals import is_refusal
from fsched.storage.rows import (
    RowState,
    core_id,
    daemon_usage,
    daemons,
    jobs,
    requests,
    row_id,
    tenants,
)
from fsched.storage.statistics import StatisticsKeeper
from fsched.storage.writeback import completion_rows, write_completions, write_tokens

USAGE_KEPT_S = 86_400.0

# The daemon's statements, each compiled once and run on the driver (storage/prepared.py, direct.py):
# through SQLAlchemy's execution each cost several times the statement itself (its writes' own are in
# storage/writeback.py and claim.py).
CANCELLED_HELD = Prepared(
    select(requests.c.id)
    .join(jobs, jobs.c.id == requests.c.job_id)
    .where(
        requests.c.lease_owner == bindparam("b_owner"),
        requests.c.state == RowState.RUNNING.value,
        jobs.c.cancel_requested_at.is_not(None),
    )
)
WEIGHTS = Prepared(select(tenants.c.name, tenants.c.weight))
RENEW = Prepared(lambda n: update(requests).where(
    listed(requests.c.id, "b_ids", n),
    requests.c.lease_owner == bindparam("b_owner"),
    requests.c.state == RowState.RUNNING.value,
).values(lease_expires_at=database_clock() + bindparam("b_lease_s", type_=Float))
    .returning(requests.c.id, requests.c.lease_epoch), listed="b_ids")
EXPIRED = Prepared(select(requests.c.id).where(
    requests.c.state == RowState.RUNNING.value,
    requests.c.lease_expires_at < database_clock(),
).limit(1))
_BEAT_VALUES = {
    "host": bindparam("b_host"), "pid": bindparam("b_pid"), "device": bindparam("b_device"),
    "model": bindparam("b_model"), "started_at": bindparam("b_started", type_=Float),
    "heartbeat_at": database_clock(),
    "stopped_at": case((bindparam("b_stopped", type_=Integer) == 1, database_clock()), else_=None),
    "stats": bindparam("b_stats", type_=daemons.c.stats.type),
}
BEAT = Prepared(update(daemons).where(daemons.c.id == bindparam("b_id")).values(**_BEAT_VALUES))
FIRST_BEAT = Prepared(daemons.insert().values(id=bindparam("b_id"), **_BEAT_VALUES))


def daemon_statements() -> list[Prepared]:
    """Every statement a daemon runs on its kept connection."""
    from fsched.storage import claim, counters, logprobs, sql_queue, writeback

    return statements_of(claim, counters, logprobs, sql_queue, writeback)


class SqlQueueStore(SqlStoreBase):
    """Claim, write back, hand back, leases, usage and heartbeats: what a daemon does.

    What a daemon does at every step and beat runs on a connection it keeps (storage/direct.py);
    the rest (hand back, sweeps, usage) through SQLAlchemy's pool, as the other stores do."""

    _statistics: StatisticsKeeper | None = None

    def __init__(self, db: Database | str | None = None, clock: Callable[[], float] = time.time):
        super().__init__(db, clock)
        self.direct = DirectConnection(self.db)

    def keep_statistics(self) -> None:
        """On PostgreSQL, keep the planner's statistics of the job table fresh from now on, on a thread of
        their own (storage/statistics.py); nothing on SQLite."""
        if self._statistics is None:
            self._statistics = StatisticsKeeper(self.db)
            self._statistics.start()

    def prepare(self, largest: int) -> None:
        dialect = self.db.engine.dialect
        for statement in daemon_statements():
            statement.compile_ahead(dialect, largest)

    def claim(
        self,
        owner: str,
        per_group: int,
        held: Mapping[tuple[str, RequestClass], int] | None = None,
        limit: int | None = None,
        lease_s: float = 30.0,
        announced: bool = False,
    ) -> list[Request]:
        """Atomically move queued requests to `running`, leased to `owner` for `lease_s`.

        Fair by construction: up to `per_group` for each (tenant, class)
        group, less what `held` says the owner already holds of it; see
        storage/claim.py.
        """
        held = held or {}
        # (On PostgreSQL the claim's own first read, alone, is that look: storage/claim.py `claim_at_once`.)
        postgresql = self.db.dialect == "postgresql"
        if not announced and not postgresql and nothing_to_take(self.direct, per_group, held):
            return []
        return self.write_step(owner, (), (), ClaimAsk(per_group, held, limit, lease_s)).claimed

    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int:
        """Persist generated tokens so far, in one transaction; returns rows written.

        Only requests `owner` still holds, under the epoch each update names,
        are written: a daemon that lost a request (cancelled, reclaimed after
        its lease expired) writes nothing for it. A request whose output the
        table refuses ends `failed` (storage.refusals); the others are written.
        """
        if not updates:
            return 0
        return self.write_step(owner, updates, ()).written

    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]:
        """End requests with their final output, in one transaction with their jobs' counters.

        For each: False, changing nothing, when the request had already ended
        (no request ends twice) or, given an `owner`, when that owner no
        longer holds it under the completion's epoch (a fenced daemon writes
        nothing). One whose output the table refuses ends `failed` instead,
        with the table's reason (storage.refusals).
        """
        if not completions:
            return []
        return self._write_step(owner, (), completions, None).finished

    def write_step(self, owner: str, updates: Sequence[TokenUpdate], completions: Sequence[Completion],
                   claim: ClaimAsk | None = None) -> StepWritten:
        """`flush_tokens`, `finish_requests` (fenced by `owner`) and a claim in one transaction: its
        lock, its commit (and on PostgreSQL its round trips for BEGIN and COMMIT) paid once, and its
        jobs' counters moved in one pass. A failure undoes all of it; a refused value sends the whole
        step again, each row under a savepoint (only the refused rows then fail)."""
        return self._write_step(owner, updates, completions, claim)

    def _write_step(self, owner: str | None, updates: Sequence[TokenUpdate],
                    completions: Sequence[Completion], claim: ClaimAsk | None) -> StepWritten:
        for c in completions:
            if not c.status.is_finished:
                raise ValueError(f"{c.status.word} is not a final status")
        if not (updates or completions or claim):
            return StepWritten()
        if claim is not None and owner is not None and not (updates or completions) \
                and self.db.dialect == "postgresql":
            claimed = claim_at_once(self.direct, owner, claim.per_group, claim.held, claim.limit,
                                    claim.lease_s, self.clock())
            if claimed is not None:
                return StepWritten(claimed=claimed)
        try:
            return self._step(owner, updates, completions, claim, careful=False)
        except Exception as exc:
            if not is_refusal(exc):
                raise
            return self._step(owner, updates, completions, claim, careful=True)

    def _step(self, owner: str | None, updates: Sequence[TokenUpdate], completions: Sequence[Completion],
              claim: ClaimAsk | None, careful: bool) -> StepWritten:
        now = self.clock()
        deltas: dict[int, CountDelta] = {}
        ready = None if careful else completion_rows(self.direct, completions, now)
        with self.direct.write(lease_only=not (updates or completions)) as tx:
            written = write_tokens(tx, owner, updates, careful, deltas, now) if owner is not None else 0
            finished = write_completions(tx, completions, owner, careful, deltas, now, ready)
            leased = Leased() if claim is None or owner is None else lease_requests(
                tx, owner, claim.per_group, claim.held, claim.limit, claim.lease_s, deltas)
            move_jobs(tx, deltas, now)
            if any(finished):
                crash_point("before_done_commit")
        return StepWritten(written, finished, leased.claimed())

    def release(self, owner: str | None = None, request_ids: Sequence[RequestId] | None = None) -> int:
        """Hand running requests back to the queue, keeping their flushed tokens.

        `owner` None releases every running request: on SQLite, one daemon
        at a time, so requests still `running` at its start were left by a
        dead one. Returns how many were released.
        """
        with self.db.write() as conn:
            query = select(requests.c.id, requests.c.job_id).where(
                requests.c.state == RowState.RUNNING.value
            )
            if owner is not None:
                query = query.where(requests.c.lease_owner == owner)
            if request_ids is not None:
                query = query.where(requests.c.id.in_([row_id(rid) for rid in request_ids]))
            rows = conn.execute(query).all()
            requeue(conn, self.db.dialect, rows, self.clock())
        return len(rows)

    def renew_leases(self, owner: str, leases: Mapping[RequestId, int], lease_s: float) -> set[RequestId]:
        """Extend `owner`'s leases (request id -> lease epoch) by `lease_s` from now; return those still held.

        A request missing from the answer was lost: its lease expired and was
        reclaimed (or it was requeued or cancelled); the daemon drops it
        without writing anything more for it.
        """
        if not leases:
            return set()
        epochs = {row_id(rid): lease_epoch for rid, lease_epoch in leases.items()}
        with self.direct.write() as tx:
            rows = tx.rows(RENEW, {"b_ids": list(epochs), "b_owner": owner, "b_lease_s": lease_s})
        return {core_id(row.id) for row in rows if epochs.get(row.id) == row.lease_epoch}

    def reclaim_expired(self) -> int:
        """Requeue running requests whose lease expired (their daemon died or stalls).

        Any live daemon sweeps; the requests resume from their flushed tokens
        wherever they are claimed next, under a higher lease epoch, so the old
        holder's late writes are refused.
        """
        query = select(requests.c.id, requests.c.job_id).where(
            requests.c.state == RowState.RUNNING.value,
            requests.c.lease_expires_at < self.db.now(),
        )
        with self.direct.read() as tx:  # most sweeps find nothing: no write lock for them
            if tx.first(EXPIRED) is None:
                return 0
        if self.db.dialect == "postgresql":
            query = query.with_for_update(of=requests, skip_locked=True)
        with self.db.write() as conn:
            rows = conn.execute(query).all()
            requeue(conn, self.db.dialect, rows, self.clock())
        return len(rows)

    def exchange_usage(self, owner: str, usage: Mapping[str, tuple[float, float]]) -> list[PeerUsage]:
        """Publish `owner`'s decayed usage per tenant (GPU s, KV token-s); return the other daemons'.

        Rows older than a day are dropped: with any sensible half-life they
        weigh nothing, and a cluster's dead daemons should not pile up.
        """
        now = self.db.now()
        with self.db.write() as conn:
            conn.execute(delete(daemon_usage).where(
                (daemon_usage.c.daemon == owner) | (daemon_usage.c.updated_at < now - USAGE_KEPT_S)
            ))
            if usage:
                stamp = conn.execute(select(now)).scalar_one()
                conn.execute(daemon_usage.insert(), [
                    {"daemon": owner, "tenant": tenant, "gpu_s": gpu, "kv_token_s": kv, "updated_at": stamp}
                    for tenant, (gpu, kv) in usage.items()
                ])
            rows = conn.execute(
                select(daemon_usage, (now - daemon_usage.c.updated_at).label("age_s"))
                .where(daemon_usage.c.daemon != owner)
            ).all()
        return [PeerUsage(row.daemon, row.tenant, row.gpu_s, row.kv_token_s, max(0.0, row.age_s))
                for row in rows]

    def cancelled_held(self, owner: str) -> list[RequestId]:
        """Requests `owner` holds whose job a user cancelled: stop them at the next step."""
        with self.direct.read() as tx:
            return [core_id(row.id) for row in tx.rows(CANCELLED_HELD, {"b_owner": owner})]

    def tenant_weights(self) -> dict[str, float]:
        with self.direct.read() as tx:
            return {row.name: row.weight for row in tx.rows(WEIGHTS)}

    def may_have_changed(self) -> bool:
        """False only when nothing was committed to the table since the last call (SQLite)."""
        return self.db.changed()

    def has_queued(self, running_too: bool = False) -> bool:
        """Whether any request waits (or, with `running_too`, is still held by some daemon)."""
        states = [RowState.QUEUED.value] + ([RowState.RUNNING.value] if running_too else [])
        with self.db.read() as conn:
            return conn.execute(
                select(requests.c.id).where(requests.c.state.in_(states)).limit(1)
            ).first() is not None

    def heartbeat(self, daemon: DaemonSummary) -> None:
        """Insert or refresh a daemon's row: its host, engine and figures (stamped by the database's
        clock: daemons' clocks may disagree)."""
        values = {"b_id": daemon.id, "b_host": daemon.host, "b_pid": daemon.pid, "b_device": daemon.device,
                  "b_model": daemon.model, "b_started": daemon.started_at,
                  "b_stopped": int(daemon.stopped_at is not None), "b_stats": daemon.stats.to_json()}
        with self.direct.write() as tx:
            if not tx.run(BEAT, values):
                tx.run(FIRST_BEAT, values)

