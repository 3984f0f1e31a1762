"""A job's counters and state, kept in step with its request rows: written once, used by both stores.

Every writer that changes request states locks the job's row, adjusts its
counters in the same transaction, and derives the job's state with the
core's pure `derive_job_state`, so there is one rule for it. On PostgreSQL a
transaction moves its jobs in one statement: one job (a claim or a completion
of an online request, each a job of its own) by an update that takes its
row's lock; several by one that locks them in id order first and then moves
each by its delta (a step's completions of many online requests, against a
locking select and then the update: of 8, 1.92 and 2.05 ms p50 against 2.20
and 2.35; of 32, 4.59 and 4.97 against 5.26 and 5.57; bench/move_jobs.py,
two runs). The rule is then `job_state_sql`, the same rule written as
SQL, held to `derive_job_state` case by case by
tests/integration/test_job_state_sql.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Float,
    Integer,
    and_,
    bindparam,
    case,
    column,
    func,
    literal,
    or_,
    select,
    update,
)

from fsched.core.jobs.jobstate import JobCounts, derive_job_state
from fsched.core.ports.records import UnknownJob
from fsched.core.types import JobState
from fsched.storage.direct import Tx
from fsched.storage.prepared import ROWS, Batched, Prepared, listed, recordset
from fsched.storage.rows import RowState, job_counts, jobs, requests


@dataclass(slots=True)
class CountDelta:
    """How one transaction changes a job's counters."""

    running: int = 0
    claimed: int = 0  # rows claimed (running too): the job has started
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0

    def ended(self, previous: RowState, state: RowState, tokens_added: int,
              prompt_tokens: int | None = None) -> None:
        """Count one request that ended in `state`, having been `previous` (with its prompt's
        length when the engine measured one)."""
        self.running -= previous is RowState.RUNNING
        self.done += state is RowState.DONE
        self.failed += state is RowState.FAILED
        self.cancelled += state is RowState.CANCELLED
        self.output_tokens += tokens_added
        self.prompt_tokens += prompt_tokens or 0

    @property
    def tokens_only(self) -> bool:
        """Only output tokens added (a flush): no state or counter of requests moves."""
        return not (self.running or self.claimed or self.done or self.failed or self.cancelled
                    or self.prompt_tokens)


def lock_job(conn: Connection, dialect: str, job_id: int):
    """The job's row, locked for this transaction on PostgreSQL (SQLite's writers take turns)."""
    query = select(jobs).where(jobs.c.id == job_id)
    if dialect == "postgresql":
        query = query.with_for_update()
    job = conn.execute(query).first()
    if job is None:
        raise UnknownJob(job_id)
    return job


def store_counts(conn: Connection, job, counts: JobCounts, now: float, **extra) -> JobState:
    """Write a job's new counters and the state they derive; return that state."""
    cancel_requested = (extra.get("cancel_requested_at") or job.cancel_requested_at) is not None
    started = (extra.get("started_at") or job.started_at) is not None
    state = derive_job_state(counts, started=started, cancel_requested=cancel_requested)
    values = {
        "num_done": counts.num_done,
        "num_failed": counts.num_failed,
        "num_cancelled": counts.num_cancelled,
        "num_running": counts.num_running,
        "state": state.value,
        **extra,
    }
    if state.finished and job.finished_at is None:
        values["finished_at"] = now
    conn.execute(update(jobs).where(jobs.c.id == job.id).values(**values))
    return state


# The jobs whose counters a write moves, locked (in id order) on PostgreSQL; SQLite's writers take turns.
_MOVED_COLUMNS = (jobs.c.id, jobs.c.num_requests, jobs.c.num_done, jobs.c.num_failed, jobs.c.num_cancelled,
                  jobs.c.num_running, jobs.c.num_output_tokens, jobs.c.num_prompt_tokens, jobs.c.started_at,
                  jobs.c.cancel_requested_at)
JOBS_TO_MOVE = Prepared(lambda n: select(*_MOVED_COLUMNS).where(listed(jobs.c.id, "b_jobs", n))
                        .order_by(jobs.c.id).with_for_update(), listed="b_jobs")
# The jobs' rows are locked already (JOBS_TO_MOVE, in id order): on PostgreSQL one statement moves them all.
_MOVED = recordset(column("b_id", jobs.c.id.type), *(column(name, Integer) for name in (
    "b_running", "b_done", "b_failed", "b_cancelled")), column("b_state", jobs.c.state.type),
    column("b_output", BigInteger), column("b_prompt", BigInteger), column("b_started", Float),
    column("b_finished", Float))
MOVED_JOB = Batched(
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values(num_running=bindparam("b_running"), num_done=bindparam("b_done"),
            num_failed=bindparam("b_failed"), num_cancelled=bindparam("b_cancelled"),
            state=bindparam("b_state"),
            num_output_tokens=bindparam("b_output"), num_prompt_tokens=bindparam("b_prompt"),
            started_at=func.coalesce(jobs.c.started_at, bindparam("b_started", type_=Float)),
            finished_at=func.coalesce(jobs.c.finished_at, bindparam("b_finished", type_=Float))),
    update(jobs)
    .where(jobs.c.id == _MOVED.c.b_id)
    .values(num_running=_MOVED.c.b_running, num_done=_MOVED.c.b_done, num_failed=_MOVED.c.b_failed,
            num_cancelled=_MOVED.c.b_cancelled, state=_MOVED.c.b_state,
            num_output_tokens=_MOVED.c.b_output, num_prompt_tokens=_MOVED.c.b_prompt,
            started_at=func.coalesce(jobs.c.started_at, _MOVED.c.b_started),
            finished_at=func.coalesce(jobs.c.finished_at, _MOVED.c.b_finished)),
)
# A step that only adds tokens: its jobs' locks taken in id order (two daemons' writes never deadlock on
# jobs), then the additions. On PostgreSQL the locks in one select (`_locked`) and the additions in one
# statement: a synced statement a job cost a round trip each, 32 a step at 32 online streams (each
# request a job of its own). SQLite has one writer at a time: an executemany, no locks.
_MORE = recordset(column("b_id", jobs.c.id.type), column("b_more", BigInteger))
_MORE_ONE = (update(jobs).where(jobs.c.id == bindparam("b_id"))
             .values(num_output_tokens=jobs.c.num_output_tokens + bindparam("b_more")))
MORE_ONE_JOB_TOKENS = Prepared(_MORE_ONE)  # a step of one job: one lock, one statement
MORE_JOB_TOKENS = Batched(
    _MORE_ONE,
    update(jobs)
    .where(jobs.c.id == _MORE.c.b_id)
    .values(num_output_tokens=jobs.c.num_output_tokens + _MORE.c.b_more),
)
LOCK_CHUNK = 400  # job ids a statement names at once


def job_state_sql(num_requests: ColumnElement, done: ColumnElement, failed: ColumnElement,
                  cancelled: ColumnElement, running: ColumnElement, started: ColumnElement,
                  cancel_requested: ColumnElement) -> ColumnElement:
    """`derive_job_state` as an SQL expression of the counters (and two conditions) it is given."""
    finished = done + failed + cancelled
    ended = case((cancel_requested, literal(JobState.CANCELLED.value)),
                 (and_(done == 0, failed > 0), literal(JobState.FAILED.value)),
                 else_=literal(JobState.COMPLETED.value))
    return case((finished >= num_requests, ended),
                (cancel_requested, literal(JobState.CANCELLING.value)),
                (or_(started, running != 0, finished != 0), literal(JobState.IN_PROGRESS.value)),
                else_=literal(JobState.QUEUED.value))


def locked_in_id_order(*where: ColumnElement) -> Any:
    """PostgreSQL: a CTE `locked` of the ids of the jobs `where` says, their rows locked in id order (the
    order that keeps two writers from deadlocking on jobs)."""
    return select(jobs.c.id).where(*where).order_by(jobs.c.id).with_for_update().cte("locked")


def moved_by(by: Callable[[str], ColumnElement]) -> dict[str, ColumnElement]:
    """A job's columns moved by a delta whose parts `by(name)` gives (`b_done`, `b_failed`, `b_cancelled`,
    `b_running`, `b_claimed`, `b_output`, `b_prompt`), its state derived (`job_state_sql`)."""
    done, failed = jobs.c.num_done + by("b_done"), jobs.c.num_failed + by("b_failed")
    cancelled, running = jobs.c.num_cancelled + by("b_cancelled"), jobs.c.num_running + by("b_running")
    started = or_(jobs.c.started_at.is_not(None), by("b_claimed") > 0)
    cancel_requested = jobs.c.cancel_requested_at.is_not(None)
    now = bindparam("b_now", type_=Float)
    return dict(num_done=done, num_failed=failed, num_cancelled=cancelled, num_running=running,
                state=job_state_sql(jobs.c.num_requests, done, failed, cancelled, running, started,
                                    cancel_requested),
                num_output_tokens=jobs.c.num_output_tokens + by("b_output"),
                num_prompt_tokens=jobs.c.num_prompt_tokens + by("b_prompt"),
                started_at=func.coalesce(jobs.c.started_at, case((by("b_claimed") > 0, now))),
                finished_at=func.coalesce(jobs.c.finished_at,
                                          case((done + failed + cancelled >= jobs.c.num_requests, now))))


_WIDE = ("b_output", "b_prompt")  # token counts: BIGINT


def _moved_one_job() -> Prepared:
    """One job's counters moved by a delta and its state derived, in one update that takes its row's
    lock (PostgreSQL: a transaction that moves one job needs no locking select first)."""
    def by(name: str) -> ColumnElement:
        return bindparam(name, type_=BigInteger if name in _WIDE else Integer)

    return Prepared(update(jobs).where(jobs.c.id == bindparam("b_id")).values(**moved_by(by))
                    .returning(jobs.c.id))


def _moved_jobs(n: int) -> Any:
    """PostgreSQL: jobs' counters moved by their deltas (a record set, `b_rows`) and their states derived,
    in one statement that first locks them in id order (`b_jobs`, sorted: as JOBS_TO_MOVE does)."""
    parts = ("b_done", "b_failed", "b_cancelled", "b_running", "b_claimed", *_WIDE)
    deltas = recordset(column("b_id", jobs.c.id.type),
                       *(column(name, BigInteger if name in _WIDE else Integer) for name in parts), name="d")
    locked = locked_in_id_order(listed(jobs.c.id, "b_jobs", n))
    return (update(jobs).where(jobs.c.id == deltas.c.b_id, jobs.c.id == locked.c.id)
            .values(**moved_by(lambda name: deltas.c[name])).returning(jobs.c.id))


MOVE_ONE_JOB = _moved_one_job()
MOVE_JOBS = Prepared(_moved_jobs, listed="b_jobs")


def move_jobs(tx: Tx, deltas: dict[int, CountDelta], now: float) -> None:
    """Every job counter a transaction moves, at its end and in one pass: its jobs locked in id order
    (so two daemons' transactions, whatever they write, never deadlock on jobs), then moved; when it only
    added tokens, the additions alone (MORE_JOB_TOKENS)."""
    if all(delta.tokens_only for delta in deltas.values()):
        more = [{"b_id": job_id, "b_more": deltas[job_id].output_tokens}
                for job_id in sorted(deltas) if deltas[job_id].output_tokens]
        if len(more) == 1:
            tx.run(MORE_ONE_JOB_TOKENS, more[0])
            return
        if tx.locks_rows:
            _locked(tx, [m["b_id"] for m in more])
        tx.many(MORE_JOB_TOKENS, more)
        return
    apply_deltas(tx, deltas, now)


def _locked(tx: Tx, ids: list[int]) -> list:
    """The jobs `ids` (sorted), locked in id order, LOCK_CHUNK a statement; UnknownJob for one missing."""
    found = []
    for i in range(0, len(ids), LOCK_CHUNK):
        part = ids[i:i + LOCK_CHUNK]
        rows = tx.rows(JOBS_TO_MOVE, {"b_jobs": part})
        if len(rows) != len(part):
            raise UnknownJob(min(set(part) - {job.id for job in rows}))
        found += rows
    return found


def apply_deltas(tx: Tx, deltas: dict[int, CountDelta], now: float) -> None:
    """Lock the jobs (in id order: two writers never deadlock on jobs) and move each one's counters by
    its delta: on SQLite one select and one executemany; on PostgreSQL one statement (MOVE_ONE_JOB for one
    job, MOVE_JOBS for several)."""
    if tx.locks_rows and len(deltas) == 1:
        ((job_id, delta),) = deltas.items()
        moved = tx.rows(MOVE_ONE_JOB, {**_delta_params(job_id, delta), "b_now": now})
        if not moved:
            raise UnknownJob(job_id)
        return
    if tx.locks_rows:
        _move_locked_together(tx, deltas, now)
        return
    move_derived(tx, deltas, now)


def move_derived(tx: Tx, deltas: dict[int, CountDelta], now: float) -> None:
    """The jobs locked (PostgreSQL) and read in id order, each one's new counters and state worked out here
    (`derive_job_state`), then written in one statement (PostgreSQL) or executemany: SQLite's way, and the
    Python rule the one-statement moves are held to (tests/integration/test_job_state_sql.py)."""
    writes = []
    for job in _locked(tx, sorted(deltas)):
        delta = deltas[job.id]
        counts = JobCounts(num_requests=job.num_requests,
                           num_running=job.num_running + delta.running + delta.claimed,
                           num_done=job.num_done + delta.done, num_failed=job.num_failed + delta.failed,
                           num_cancelled=job.num_cancelled + delta.cancelled)
        state = derive_job_state(counts, started=job.started_at is not None or delta.claimed > 0,
                                 cancel_requested=job.cancel_requested_at is not None)
        writes.append({"b_id": job.id, "b_running": counts.num_running, "b_done": counts.num_done,
                       "b_failed": counts.num_failed, "b_cancelled": counts.num_cancelled,
                       "b_state": state.value, "b_output": job.num_output_tokens + delta.output_tokens,
                       "b_prompt": job.num_prompt_tokens + delta.prompt_tokens,
                       "b_started": now if delta.claimed else None,
                       "b_finished": now if state.finished else None})
    tx.many(MOVED_JOB, writes)


def _delta_params(job_id: int, delta: CountDelta) -> dict:
    """A job's delta as `moved_by`'s parts name it (the claimed count among the running)."""
    return {"b_id": job_id, "b_done": delta.done, "b_failed": delta.failed, "b_cancelled": delta.cancelled,
            "b_running": delta.running + delta.claimed, "b_claimed": delta.claimed,
            "b_output": delta.output_tokens, "b_prompt": delta.prompt_tokens}


def _move_locked_together(tx: Tx, deltas: dict[int, CountDelta], now: float) -> None:
    """PostgreSQL: MOVE_JOBS, LOCK_CHUNK jobs a statement in id order; UnknownJob for one missing."""
    ids = sorted(deltas)
    for i in range(0, len(ids), LOCK_CHUNK):
        part = ids[i:i + LOCK_CHUNK]
        rows = [_delta_params(job_id, deltas[job_id]) for job_id in part]
        moved = tx.rows(MOVE_JOBS, {"b_jobs": part, ROWS: rows, "b_now": now})
        if len(moved) != len(part):
            raise UnknownJob(min(set(part) - {row.id for row in moved}))


def requeue(conn: Connection, dialect: str, rows: Sequence, now: float) -> None:
    """Running requests (id, job_id) back to `queued`, keeping their tokens; counters follow.

    A request whose job was cancelled ends `cancelled` instead (tokens kept): no
    daemon claims work of a cancelled job, so requeued it would wait forever and
    its job would read `cancelling` for good. That happens when the cancel lands
    while the holder cannot act on it: a daemon killed, stopped or failing a step
    before its next sync. The job's row is locked before its cancel mark is read,
    so a concurrent `cancel` (which locks it too) is seen either way.
    """
    if not rows:
        return
    conn.execute(
        update(requests)
        .where(requests.c.id.in_([row.id for row in rows]))
        .values(state=RowState.QUEUED.value, lease_owner=None, lease_expires_at=None)
    )
    per_job: dict[int, list[int]] = {}
    for row in rows:
        per_job.setdefault(row.job_id, []).append(row.id)
    for job_id in sorted(per_job):  # a fixed order: two sweepers never deadlock on jobs
        job = lock_job(conn, dialect, job_id)
        ids = per_job[job_id]
        cancelled = 0
        if job.cancel_requested_at is not None:
            cancelled = conn.execute(
                update(requests)
                .where(requests.c.id.in_(ids))
                .values(state=RowState.CANCELLED.value, finished_at=now)
            ).rowcount
        counts = replace(job_counts(job), num_running=job.num_running - len(ids),
                         num_cancelled=job.num_cancelled + cancelled)
        store_counts(conn, job, counts, now=now)
