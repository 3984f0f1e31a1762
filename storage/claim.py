"""The fair, atomic claim: queued requests -> running, leased to one daemon.

Each claim raises the request's lease epoch (the fencing token its writes
must name) and sets the lease's expiry on the database's clock.

Fair by construction: up to `per_group` for each (tenant, class) group, less
what the daemon already holds of it, taking a group's jobs by base priority
then age and each job's requests in input order. So one tenant's
50,000-line file never hides another tenant's work from the scheduler.

A claim costs a fixed number of statements however many jobs it takes from:
the jobs of one request (every online request, `fsched generate`) are leased
in one update that returns their rows; the other jobs it takes whole are read
in one select, their rows moved in one update; only a job it takes part of is
read with a limit of its own. (A job of one cannot hold more queued rows than
its counters say, so its update needs no limit: a bigger job's read keeps
its own, since its counters may lag a requeue another transaction committed.)
Its jobs' counters move with the rest of its transaction's
(storage/counters.py `move_jobs`: one locking select and one executemany on
SQLite, one statement on PostgreSQL),
which a daemon's step shares with its tokens and completions
(`SqlQueueStore.write_step`).

On PostgreSQL a claim that takes only whole jobs of one request (what a
server's new online requests ask for) goes in two round trips
(`claim_at_once`): the jobs with work read alone, then one query that
begins a transaction, leases their rows and moves their jobs' counters in
one statement, and commits. Through a transaction of its statements one by
one it took six (BEGIN, that read, the lease, the jobs' lock, their
counters, COMMIT; its jobs' counters now one statement too). The claim of
8 new online requests took 1.39 and 1.53 ms p50 against 1.89 and 2.12
(0.72-0.74x) on an idle 2-core machine, 1.49 against 2.05 with its two
cores taken by two spinning processes; of 32, 3.15 against 5.91 and 3.70
against 11.22 (bench/claim_latency.py, `--jobs 8|32 --busy 0|2`; before
the general claim moved its jobs in one statement: 1.46 against 2.24 for
8, 3.22 against 7.29 for 32).
One statement for the read too (the share rule in SQL, one round trip)
was no better in the whole online path (bench/online_ab.py at 32 streams:
first token p50 40.6 and 43.2 ms with two round trips, 46.3 and 48.5 with
one, four runs each way twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from sqlalchemy import Float, Integer, bindparam, literal_column, select, update
from sqlalchemy.sql.elements import ColumnElement

from fsched.core.sched.request import Request
from fsched.core.types import RequestClass
from fsched.storage.counters import CountDelta, locked_in_id_order, moved_by
from fsched.storage.db import database_clock
from fsched.storage.direct import DirectConnection, Tx
from fsched.storage.logprobs import read_whole as read_logprobs
from fsched.storage.output import read_whole as read_outputs
from fsched.storage.prepared import Prepared, listed, one_of
from fsched.storage.rows import (
    UNFINISHED_JOB_STATES,
    WAITING,
    RowState,
    claimed_request,
    jobs,
    requests,
)

Group = tuple[str, RequestClass]
IN_CHUNK = 400  # ids a statement names at once (SQLite's older builds bind at most 999 parameters)

# Jobs with work to take: by the state's index (a table of many finished online jobs is not read), a
# cancelling job's mark excluding it as any cancelled job's does.
CANDIDATE_JOBS = Prepared(
    select(jobs.c.id, jobs.c.tenant, jobs.c["class"].label("request_class"), jobs.c.priority,
           jobs.c.num_requests, WAITING.label("waiting"))
    .where(one_of(jobs.c.state, UNFINISHED_JOB_STATES), jobs.c.cancel_requested_at.is_(None), WAITING > 0)
    .order_by(jobs.c.priority, jobs.c.id)
)
# The queued rows of whole jobs, and of one job up to a limit (both in input order). On PostgreSQL the
# rows another daemon is claiming are skipped, not waited for (SQLite's writers take turns: no clause).
_QUEUED_ROWS = (
    select(requests, jobs.c.tenant, jobs.c["class"].label("request_class"), jobs.c.priority)
    .join(jobs, jobs.c.id == requests.c.job_id)
    .where(requests.c.state == RowState.QUEUED.value)
)
ROWS_OF_JOBS = Prepared(lambda n: _QUEUED_ROWS.where(listed(requests.c.job_id, "b_jobs", n))
                        .order_by(requests.c.job_id, requests.c.idx)
                        .with_for_update(of=requests, skip_locked=True), listed="b_jobs")
ROWS_OF_JOB = Prepared(_QUEUED_ROWS.where(requests.c.job_id == bindparam("b_job")).order_by(requests.c.idx)
                       .limit(bindparam("b_want")).with_for_update(of=requests, skip_locked=True))
# Rows to `running`, leased to an owner until the database's clock plus the lease.
_LEASED = dict(
    state=RowState.RUNNING.value,
    lease_owner=bindparam("b_owner"),
    lease_epoch=requests.c.lease_epoch + 1,
    lease_expires_at=database_clock() + bindparam("b_lease_s", type_=Float),
    attempts=requests.c.attempts + 1,
)
LEASE = Prepared(lambda n: update(requests).where(listed(requests.c.id, "b_ids", n)).values(**_LEASED),
                 listed="b_ids")


def _queued_of_jobs(n: int):
    return (listed(requests.c.job_id, "b_jobs", n), requests.c.state == RowState.QUEUED.value)


# The queued row of each job of one, leased, returned as the lease left it (skipping, on PostgreSQL, a row
# another daemon is claiming, as the reads above do).
LEASE_SINGLES = Prepared(lambda n: update(requests).where(requests.c.id.in_(
    select(requests.c.id).where(*_queued_of_jobs(n)).with_for_update(skip_locked=True)
)).values(**_LEASED).returning(*requests.c), listed="b_jobs")
# SQLite's writers take turns: the update names the rows itself.
LEASE_SINGLES_ALONE = Prepared(lambda n: update(requests).where(*_queued_of_jobs(n)).values(**_LEASED)
                               .returning(*requests.c), listed="b_jobs")


def _lease_singles_moved(n: int):
    """PostgreSQL: LEASE_SINGLES and its jobs' counters moved in one statement (`claim_at_once`): the
    leased rows' jobs locked in id order and moved as counters.MOVE_ONE_JOB moves a claimed one (one more
    running, started, its state derived); the leased rows returned."""
    leased = update(requests).where(requests.c.id.in_(
        select(requests.c.id).where(*_queued_of_jobs(n)).with_for_update(skip_locked=True)
    )).values(**_LEASED).returning(*requests.c).cte("leased")
    locked = locked_in_id_order(jobs.c.id.in_(select(leased.c.job_id)))
    moved = update(jobs).where(jobs.c.id == locked.c.id).values(**moved_by(_one_claimed)).cte("moved")
    return select(leased).add_cte(moved)


def _one_claimed(name: str) -> ColumnElement:
    """A claimed job of one request's delta, part by part as counters.moved_by reads it: one more running."""
    return literal_column("1" if name in ("b_running", "b_claimed") else "0", Integer)


LEASE_SINGLES_MOVED = Prepared(_lease_singles_moved, listed="b_jobs")


def nothing_to_take(direct: DirectConnection, per_group: int, held: Mapping[Group, int]) -> bool:
    """A read before the write lock, which most unannounced claims end: no group with work has room."""
    with direct.read() as tx:
        candidates = tx.rows(CANDIDATE_JOBS)
    room = {(j.tenant, RequestClass(j.request_class)) for j in candidates}
    return all(per_group <= held.get(group, 0) for group in room)


def claim_at_once(direct: DirectConnection, owner: str, per_group: int, held: Mapping[Group, int],
                  limit: int | None, lease_s: float, now: float) -> list[Request] | None:
    """PostgreSQL: the claim in two round trips where it takes only whole jobs of one request (every
    online request): the jobs with work read alone, then their rows leased and their counters moved in one
    statement, in a transaction of its own sent as one query (`DirectConnection.write_once`). None where
    the claim takes from a job of several, or from more than IN_CHUNK jobs (`lease_requests` then makes
    it, in a transaction of its own).
    A row another daemon took meanwhile is not leased, its job not moved (as in `lease_requests`)."""
    with direct.read() as tx:
        candidates = {job.id: job for job in tx.rows(CANDIDATE_JOBS)}
    wants = _wants(candidates.values(), per_group, held, limit)
    if not wants:
        return []
    if len(wants) > IN_CHUNK or any(not everything or candidates[job_id].num_requests != 1
                                    for job_id, (_, everything) in wants.items()):
        return None
    leased = direct.write_once(LEASE_SINGLES_MOVED, {"b_jobs": sorted(wants), "b_owner": owner,
                                                     "b_lease_s": lease_s, "b_now": now}, lease_only=True)
    resumed = [row for row in leased if row.num_logprobs or row.num_output_tokens]
    stored, outputs = {}, {}
    if resumed:  # the rows are this daemon's now: their earlier output read after the commit
        with direct.read() as tx:
            stored, outputs = _earlier_output(tx, resumed)
    by_job = {row.job_id: claimed_request(row, stored.get(row.id, ()), job=candidates[row.job_id],
                                          output=outputs.get(row.id)) for row in leased}
    return [by_job[job_id] for job_id in wants if job_id in by_job]


class Leased:
    """The rows a claim's transaction leased, and what `claimed` makes of them once it has committed:
    the write lock is not held while their requests are made (on SQLite every other writer waits for
    it, a server's group commit of the next requests among them)."""

    __slots__ = ("_order", "_candidates", "_singles", "_rows", "_stored", "_outputs", "_read")

    def __init__(self, order: Sequence[int] = (), candidates: Mapping | None = None, singles: Sequence = (),
                 rows: Sequence = (), stored: Mapping | None = None, outputs: Mapping | None = None,
                 read: Callable[[Sequence], list] | None = None):
        self._order = order  # the jobs, in the claim's order
        self._candidates = candidates or {}
        # The leased rows of whole jobs of one (values not read yet: `read` reads them), and the others'.
        self._singles, self._rows, self._read = singles, rows, read
        self._stored, self._outputs = stored or {}, outputs or {}

    def claimed(self) -> list[Request]:
        """The claimed requests, jobs in the claim's order and each job's in input order."""
        stored, outputs, candidates = self._stored, self._outputs, self._candidates
        by_job: dict[int, list[Request]] = {}
        for row in self._read(self._singles) if self._singles else ():
            by_job[row.job_id] = [claimed_request(row, stored.get(row.id, ()), job=candidates[row.job_id],
                                                  output=outputs.get(row.id))]
        for row in self._rows:
            by_job.setdefault(row.job_id, []).append(
                claimed_request(row, stored.get(row.id, ()), output=outputs.get(row.id)))
        return [request for job_id in self._order for request in by_job.get(job_id, ())]


def lease_requests(
    tx: Tx,
    owner: str,
    per_group: int,
    held: Mapping[Group, int],
    limit: int | None,
    lease_s: float,
    deltas: dict[int, CountDelta],
) -> Leased:
    """Claim for `owner` in this write transaction (see the module's docstring): the rows leased, whose
    requests `Leased.claimed` makes after the commit. The claimed rows' jobs are counted in `deltas` (the
    transaction moves its jobs' counters once, at its end: counters.move_jobs)."""
    candidates = {job.id: job for job in tx.rows(CANDIDATE_JOBS)}
    wants = _wants(candidates.values(), per_group, held, limit)
    if not wants:
        return Leased()
    lease = {"b_owner": owner, "b_lease_s": lease_s}
    singles = {job_id for job_id, (_, everything) in wants.items()
               if everything and candidates[job_id].num_requests == 1}
    lease_singles = LEASE_SINGLES if tx.locks_rows else LEASE_SINGLES_ALONE
    leased, read = [], None
    for part in _chunks(sorted(singles)):  # their values read after the commit (`Leased.claimed`)
        unread, read = tx.unread_rows(lease_singles, {"b_jobs": part, **lease})
        leased += unread
    rows = _queued_rows(tx, {job_id: want for job_id, want in wants.items() if job_id not in singles})
    for part in _chunks([row.id for row in rows]):
        tx.run(LEASE, {"b_ids": part, **lease})
    for row in (*leased, *rows):
        deltas.setdefault(row.job_id, CountDelta()).claimed += 1
    resumed = [row for row in leased if row.num_logprobs or row.num_output_tokens]
    stored, outputs = _earlier_output(tx, (*(read(resumed) if resumed else ()), *rows))
    return Leased(list(wants), candidates, leased, rows, stored, outputs, read)


def _earlier_output(tx: Tx, rows: Sequence) -> tuple[dict, dict]:
    """What claimed rows that ran before (resumes) already made: their logprobs, and the outputs their rows
    hold only part of (the rest in pieces), by row id."""
    return read_logprobs(tx, [row.id for row in rows if row.num_logprobs]), read_outputs(tx, rows)


def _wants(candidates: Iterable, per_group: int, held: Mapping[Group, int], limit: int | None
           ) -> dict[int, tuple[int, bool]]:
    """job id -> (how many of its queued requests to take, whether that is all of them), in the
    claim's order: each group's room shared out among its jobs by priority then age."""
    room: dict[Group, int] = {}
    wants: dict[int, tuple[int, bool]] = {}
    taken = 0
    for job in candidates:
        group = (job.tenant, RequestClass(job.request_class))
        room.setdefault(group, per_group - held.get(group, 0))
        want = room[group] if limit is None else min(room[group], limit - taken)
        want = min(want, job.waiting)
        if want <= 0:
            continue
        wants[job.id] = (want, want >= job.waiting)
        room[group] -= want
        taken += want
    return wants


def _queued_rows(tx: Tx, wants: Mapping[int, tuple[int, bool]]) -> list:
    """The rows to lease, in the claim's order: the whole jobs' in one select, the others a job at a
    time; each job's at most what it wants (its counters may lag a concurrent daemon's claim)."""
    whole = [job_id for job_id, (_, everything) in wants.items() if everything]
    by_job: dict[int, list] = {}
    for part in _chunks(whole):
        for row in tx.rows(ROWS_OF_JOBS, {"b_jobs": part}):
            by_job.setdefault(row.job_id, []).append(row)
    for job_id, (want, everything) in wants.items():
        if not everything:
            by_job[job_id] = tx.rows(ROWS_OF_JOB, {"b_job": job_id, "b_want": want})
    return [row for job_id, (want, _) in wants.items() for row in by_job.get(job_id, ())[:want]]


def _chunks(ids: Sequence[int]) -> list[list[int]]:
    return [list(ids[i:i + IN_CHUNK]) for i in range(0, len(ids), IN_CHUNK)]
