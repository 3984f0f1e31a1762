"""SqlQueueStore: the daemons' side of the job table (QueueStore) over SQLAlchemy Core.

Every method is one transaction. Leases and heartbeats are stamped by the
database's clock, so daemons whose clocks disagree still agree on who holds
what. Request ids are the core's text ids outside this module and integer
keys inside it (`rows.row_id`, `rows.core_id`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import Float, Integer, bindparam, case, delete, func, select, update

from fsched.core.faults import crash_point
from fsched.core.ports.records import (
    Completion,
    DaemonSummary,
    PeerUsage,
    StoreError,
    TokenUpdate,
)
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId
from fsched.storage.base import SqlStoreBase
from fsched.storage.claim import claim_requests
from fsched.storage.counters import CountDelta, apply_deltas, requeue
from fsched.storage.db import Database, database_clock
from fsched.storage.direct import DirectConnection, Tx
from fsched.storage.logprobs import append as append_logprobs
from fsched.storage.logprobs import new_piece
from fsched.storage.prepared import Prepared, listed, statements_of
from fsched.storage.refusals import is_refusal, write_each
from fsched.storage.rows import (
    RowState,
    core_id,
    daemon_usage,
    daemons,
    jobs,
    requests,
    row_id,
    row_state,
    tenants,
)

USAGE_KEPT_S = 86_400.0

# The daemon's statements, each compiled once and run on the driver (storage/prepared.py, direct.py):
# through SQLAlchemy's execution each cost several times the statement itself.
FLUSH_TOKENS = Prepared(
    update(requests)
    .where(requests.c.id == bindparam("b_id"))
    .values(
        output_tokens=bindparam("b_tokens", type_=requests.c.output_tokens.type),
        output_text=bindparam("b_text", type_=requests.c.output_text.type),
        num_logprobs=bindparam("b_logprobs"),
        num_output_tokens=bindparam("b_num"),
        first_token_at=func.coalesce(requests.c.first_token_at, bindparam("b_first", type_=Float)),
    )
)
FINISH_REQUEST = Prepared(
    update(requests)
    .where(requests.c.id == bindparam("b_id"))
    .values(
        state=bindparam("b_state"),
        output_tokens=bindparam("b_tokens", type_=requests.c.output_tokens.type),
        output_text=bindparam("b_text", type_=requests.c.output_text.type),
        num_logprobs=bindparam("b_logprobs"),
        num_output_tokens=bindparam("b_num"),
        finish_reason=bindparam("b_reason"),
        prompt_tokens=bindparam("b_prompt"),
        model=bindparam("b_model"),
        error=bindparam("b_error", type_=requests.c.error.type),
        finished_at=bindparam("b_now", type_=Float),
        lease_owner=None,
        lease_expires_at=None,
        first_token_at=func.coalesce(requests.c.first_token_at, bindparam("b_first", type_=Float)),
    )
)
FAIL_REFUSED = Prepared(
    update(requests)
    .where(requests.c.id == bindparam("b_id"))
    .values(state=RowState.FAILED.value, error=bindparam("b_error", type_=requests.c.error.type),
            finished_at=bindparam("b_now", type_=Float), lease_owner=None, lease_expires_at=None)
)
MORE_JOB_TOKENS = Prepared(
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values(num_output_tokens=jobs.c.num_output_tokens + bindparam("b_more"))
)
HELD_ROWS = Prepared(lambda n: select(
    requests.c.id, requests.c.job_id, requests.c.num_output_tokens, requests.c.lease_epoch,
    requests.c.num_logprobs,
).where(
    listed(requests.c.id, "b_ids", n),
    requests.c.lease_owner == bindparam("b_owner"),
    requests.c.state == RowState.RUNNING.value,
), listed="b_ids")
ENDING_ROWS = Prepared(lambda n: select(
    requests.c.id, requests.c.job_id, requests.c.state, requests.c.num_output_tokens, requests.c.lease_owner,
    requests.c.lease_epoch, requests.c.num_logprobs,
).where(listed(requests.c.id, "b_ids", n)), listed="b_ids")
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
    from fsched.storage import claim, counters, logprobs, sql_queue

    return statements_of(claim, counters, logprobs, sql_queue)


class SqlQueueStore(SqlStoreBase):
    """Claim, write back, hand back, leases, usage and heartbeats: what a daemon does.

    What a daemon does at every step and beat runs on a connection it keeps (storage/direct.py);
    the rest (hand back, sweeps, usage) through SQLAlchemy's pool, as the other stores do."""

    def __init__(self, db: Database | str | None = None, clock: Callable[[], float] = time.time):
        super().__init__(db, clock)
        self.direct = DirectConnection(self.db)

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
        `claim.claim_requests`.
        """
        return claim_requests(self.direct, self.clock(), owner, per_group, held or {}, limit, lease_s,
                              look_first=not announced)

    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int:
        """Persist generated tokens so far, in one transaction; returns rows written.

        Only requests `owner` still holds, under the epoch each update names,
        are written: a daemon that lost a request (cancelled, reclaimed after
        its lease expired) writes nothing for it. A request whose output the
        table refuses ends `failed` (storage.refusals); the others are written.
        """
        if not updates:
            return 0
        try:
            return self._flush(owner, updates, careful=False)
        except Exception as exc:
            if not is_refusal(exc):
                raise
            return self._flush(owner, updates, careful=True)

    def _flush(self, owner: str, updates: Sequence[TokenUpdate], careful: bool) -> int:
        with self.direct.write() as tx:
            keys = [row_id(u.request_id) for u in updates]
            rows = {row.id: row for row in tx.rows(HELD_ROWS, {"b_ids": keys, "b_owner": owner})}
            writes, pieces = [], {}
            for u in updates:
                row = rows.get(row_id(u.request_id))
                if row is None or (u.lease_epoch is not None and row.lease_epoch != u.lease_epoch):
                    continue  # fenced: the lease was lost (reclaimed, cancelled, requeued)
                pieces[row.id] = new_piece(row.id, row.num_logprobs, u.logprobs)
                writes.append({"b_id": row.id, "b_tokens": list(u.tokens), "b_text": u.text,
                               "b_logprobs": max(row.num_logprobs, len(u.logprobs)), "b_num": len(u.tokens),
                               "b_first": u.first_token_at})
            refused = write_each(tx, FLUSH_TOKENS, writes, _piece_of(pieces)) if careful else {}
            if not careful:
                tx.many(FLUSH_TOKENS, writes)  # one executemany, not a statement per row
                append_logprobs(tx, pieces.values())
            per_job: dict[int, int] = {}
            for w in writes:
                if w["b_id"] not in refused:
                    row = rows[w["b_id"]]
                    per_job[row.job_id] = per_job.get(row.job_id, 0) + w["b_num"] - row.num_output_tokens
            tx.many(MORE_JOB_TOKENS, [{"b_id": job_id, "b_more": more} for job_id, more in per_job.items()
                                      if more])
            self._fail_refused(tx, {key: (rows[key].job_id, why) for key, why in refused.items()})
        return len(writes) - len(refused)

    def _fail_refused(self, tx: Tx, refused: Mapping[int, tuple[int, str]]) -> None:
        """End the running requests whose tokens the table refused: failed, with why (tokens as flushed)."""
        if not refused:
            return
        now = self.clock()
        deltas: dict[int, CountDelta] = {}
        tx.many(FAIL_REFUSED, [{"b_id": key, "b_error": why, "b_now": now}
                               for key, (_, why) in refused.items()])
        for job_id, _ in refused.values():
            deltas.setdefault(job_id, CountDelta()).ended(RowState.RUNNING, RowState.FAILED, 0)
        apply_deltas(tx, deltas, now)

    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]:
        """End requests with their final output, in one transaction with their jobs' counters.

        For each: False, changing nothing, when the request had already ended
        (no request ends twice) or, given an `owner`, when that owner no
        longer holds it under the completion's epoch (a fenced daemon writes
        nothing). One whose output the table refuses ends `failed` instead,
        with the table's reason (storage.refusals).
        """
        for c in completions:
            if not c.status.is_finished:
                raise ValueError(f"{c.status.word} is not a final status")
        if not completions:
            return []
        try:
            return self._finish(completions, owner, careful=False)
        except Exception as exc:
            if not is_refusal(exc):
                raise
            return self._finish(completions, owner, careful=True)

    def _finish(self, completions: Sequence[Completion], owner: str | None, careful: bool) -> list[bool]:
        now = self.clock()
        with self.direct.write() as tx:
            outcome, writes, ends, pieces = self._completion_writes(tx, completions, owner, now)
            if careful:
                refused = write_each(tx, FINISH_REQUEST, writes, _piece_of(pieces))
                writes = [_failed_write(w, refused[w["b_id"]], pieces.get(w["b_id"])) if w["b_id"] in refused
                          else w for w in writes]
                tx.many(FINISH_REQUEST, [w for w in writes if w["b_id"] in refused])
            else:
                tx.many(FINISH_REQUEST, writes)  # one executemany, not a statement per row
                append_logprobs(tx, pieces.values())
            per_job: dict[int, CountDelta] = {}
            for w, (job_id, previous, tokens_before) in zip(writes, ends, strict=True):
                per_job.setdefault(job_id, CountDelta()).ended(
                    previous, RowState(w["b_state"]), w["b_num"] - tokens_before, w["b_prompt"])
            apply_deltas(tx, per_job, now)
            if per_job:
                crash_point("before_done_commit")
        return outcome

    def _completion_writes(
        self, tx: Tx, completions: Sequence[Completion], owner: str | None, now: float
    ) -> tuple[list[bool], list[dict], list[tuple[int, RowState, int]], dict[int, dict | None]]:
        """Which completions may be written (fencing), their rows, for each row its job, state
        and tokens before, and the logprobs each appends."""
        keys = [row_id(c.request_id) for c in completions]
        rows = {row.id: row for row in tx.rows(ENDING_ROWS, {"b_ids": keys})}
        outcome, writes, ends, pieces = [], [], [], {}
        for key, c in zip(keys, completions, strict=True):
            row = rows.get(key)
            if row is None:
                raise StoreError(f"no request with id {c.request_id}")
            previous = RowState(row.state)
            fenced = owner is not None and (
                row.lease_owner != owner or (c.lease_epoch is not None and row.lease_epoch != c.lease_epoch)
            )
            outcome.append(not (previous.finished or fenced))
            if not outcome[-1]:
                continue
            pieces[key] = new_piece(key, row.num_logprobs, c.logprobs)
            writes.append({
                "b_id": key, "b_state": row_state(c.status).value, "b_tokens": list(c.output_tokens),
                "b_text": c.output_text, "b_logprobs": max(row.num_logprobs, len(c.logprobs)),
                "b_num": len(c.output_tokens), "b_reason": c.status.finish_reason,
                "b_prompt": c.prompt_tokens, "b_model": c.model, "b_error": c.error, "b_now": now,
                "b_first": c.first_token_at,
            })
            ends.append((row.job_id, previous, row.num_output_tokens))
        return outcome, writes, ends, pieces

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


def _failed_write(write: dict, why: str, piece: dict | None) -> dict:
    """A completion the table refused, written failed instead: its tokens (integers) and why (the
    logprobs it would have appended are not)."""
    stored = write["b_logprobs"] if piece is None else piece["start"]
    return {**write, "b_state": RowState.FAILED.value, "b_text": "", "b_logprobs": stored,
            "b_reason": None, "b_error": why}


def _piece_of(pieces: Mapping[int, dict | None]):
    """What a write of one request appends besides its row: its new logprobs."""
    return lambda tx, write: append_logprobs(tx, [pieces.get(write["b_id"])])
