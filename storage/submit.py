"""Storing submitted jobs: tenants created on first use, the queue limit, the rows in chunks.

Functions of an open write transaction; `SqlCatalogStore.submit` runs them
all in one, so a submit lands whole or not at all.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate, islice

from sqlalchemy import (
    ARRAY,
    Connection,
    Float,
    Integer,
    String,
    any_,
    bindparam,
    column,
    func,
    literal,
    literal_column,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.elements import ColumnElement

from fsched.core.faults import crash_point
from fsched.core.ports.catalog import admit_each
from fsched.core.ports.records import JobSubmission, KeyRevoked, QueueFull
from fsched.core.types import JobState
from fsched.storage.direct import DirectConnection, Ready
from fsched.storage.kept import Batches, KeptWriter
from fsched.storage.models import ApiKeyRow
from fsched.storage.prepared import Prepared, listed, one_of, recordset
from fsched.storage.rows import UNFINISHED, UNFINISHED_JOB_STATES, RowState, jobs, requests, tenants

INSERT_CHUNK = 5_000

# Built once: every online request runs these (a new statement each time cost more than its execution).
_NAMES = bindparam("b_names", expanding=True)
TENANTS_LOCKED = select(tenants.c.name).where(tenants.c.name.in_(_NAMES)).with_for_update()
EXISTING_TENANTS = select(tenants.c.name).where(tenants.c.name.in_(_NAMES))
UNFINISHED_BY_TENANT = (
    select(jobs.c.tenant, func.sum(UNFINISHED))
    .where(jobs.c.tenant.in_(_NAMES), one_of(jobs.c.state, UNFINISHED_JOB_STATES))
    .group_by(jobs.c.tenant)
)
_KEYS = ApiKeyRow.__table__
JOB_INSERT = jobs.insert().returning(jobs.c.id)
REQUESTS_INSERT = requests.insert()


def check_queue_limit(conn: Connection, submissions: Sequence[JobSubmission], limit: int) -> None:
    """QueueFull when a tenant's unfinished requests would go over `limit`."""
    adding = Counter()
    for submission in submissions:
        adding[submission.tenant] += len(submission.requests)
    have = unfinished_of(conn, set(adding))
    for tenant in sorted(adding):
        if have[tenant] + adding[tenant] > limit:
            raise QueueFull(tenant, have[tenant], adding[tenant], limit)


def unfinished_of(conn: Connection, names: set[str]) -> Counter:
    """Each tenant's unfinished requests, its row locked: concurrent submits of one tenant take turns
    on PostgreSQL (SQLite's BEGIN IMMEDIATE already serialises writers)."""
    conn.execute(TENANTS_LOCKED, {"b_names": sorted(names)})
    # On PostgreSQL a statement sees what was committed before it began: the count comes after the lock.
    return Counter({tenant: int(n or 0) for tenant, n in conn.execute(
        UNFINISHED_BY_TENANT, {"b_names": sorted(names)}).all()})


def create_missing_tenants(conn: Connection, dialect: str, names: set[str], now: float) -> set[str]:
    """Create the tenants not there yet (weight 1); return those this call created."""
    existing = set(conn.execute(EXISTING_TENANTS, {"b_names": sorted(names)}).scalars())
    missing = names - existing
    if not missing:
        return set()
    # ON CONFLICT DO NOTHING: two first submits of one new tenant at once (on
    # PostgreSQL both can pass the check above) both succeed; one creates it.
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    created = conn.execute(
        insert(tenants)
        .values([{"name": name, "weight": 1.0, "created_at": now} for name in sorted(missing)])
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(tenants.c.name)
    ).scalars()
    return set(created)


def insert_job(conn: Connection, submission: JobSubmission, now: float) -> int:
    """The job's row, then its requests in chunks; return the job's id."""
    job_id = conn.execute(JOB_INSERT, _job_row(submission, now)).scalar_one()
    rows = (_request_row(job_id, idx, spec, now) for idx, spec in enumerate(submission.requests))
    while chunk := list(islice(rows, INSERT_CHUNK)):
        conn.execute(REQUESTS_INSERT, chunk)
        crash_point("mid_submit")
    return job_id


def _job_row(submission: JobSubmission, now: float) -> dict:
    return {
        "tenant": submission.tenant,
        "class": submission.request_class.value,
        "priority": submission.priority,
        "name": submission.name,
        "origin": submission.origin.value,
        "key_id": submission.key_id,
        "state": JobState.QUEUED.value,
        "num_requests": len(submission.requests),
        "num_done": 0,
        "num_failed": 0,
        "num_cancelled": 0,
        "num_running": 0,
        "num_output_tokens": 0,
        "num_prompt_tokens": 0,
        "submitted_at": now,
    }


def _request_row(job_id: int, idx: int, spec, now: float) -> dict:
    return {
        "job_id": job_id,
        "idx": idx,
        "custom_id": spec.custom_id,
        "choice": spec.choice,
        "answer": spec.answer.to_json() or None,
        "endpoint": spec.endpoint.value,
        "prompt": spec.prompt,
        "messages": [m.to_json() for m in spec.messages] if spec.messages else None,
        "render": spec.render.to_json(),
        "params": _seeded(spec.params.to_json()),
        "max_tokens": spec.params.max_tokens,
        "model": spec.model,
        "state": RowState.QUEUED.value,
        "output_tokens": [],
        "output_text": "",
        "num_logprobs": 0,
        "num_output_tokens": 0,
        "attempts": 0,
        "enqueued_at": now,
        "lease_epoch": 0,
    }


def _seeded(params: dict) -> dict:
    """Every stored request has a seed, so its sampling replays after a restart: `params` (a request's
    sampling parameters as stored) with one drawn where the request named none. The seed goes into the
    stored form itself: a copy of the parameters with it would check every field again, which cost more
    than the rest of the row's making."""
    if params["seed"] is None:
        params["seed"] = secrets.randbits(63)
    return params


# -- PostgreSQL's group commit: statements sent together, a batch a round trip (storage/kept.py) ------------
#
# Every online request waits for its group's transaction, and every round trip in it is a wait on the
# server and then for the server thread's turn again behind a busy event loop. In the common case (the
# tenants there, every key usable, every tenant under its limit) a group commit is one round trip: BEGIN,
# the tenants' rows locked, then one statement that stores every job and its requests only if that case
# holds (counted after the lock: a statement sees what was committed before it began), then COMMIT. Else
# that statement stores nothing, and the group goes again as before in a transaction of its own: the
# tenants locked with the keys read and their counts (a round trip), the missing tenants created (another,
# rarely), then the jobs that may be stored and COMMIT (one more).

def _any(column: ColumnElement, param: str) -> ColumnElement:
    """`column = ANY` the array parameter `param` (a list: one statement for every length)."""
    return column == any_(bindparam(param, type_=ARRAY(String)))


def _unfinished_jobs() -> ColumnElement:
    return one_of(jobs.c.state, UNFINISHED_JOB_STATES)


_LOCKED_NAMES = select(tenants.c.name).where(_any(tenants.c.name, "b_names")).with_for_update()
LOCK_NAMED_TENANTS = Prepared(_LOCKED_NAMES)
_LOCKED_CTE = _LOCKED_NAMES.cte("locked")
LOCK_TENANTS_READ_KEYS = Prepared(union_all(
    select(_LOCKED_CTE.c.name, literal(False).label("is_key")),
    select(_KEYS.c.id, literal(True)).where(_any(_KEYS.c.id, "b_key_ids"), _KEYS.c.revoked_at.is_(None))))
COUNT_UNFINISHED = Prepared(
    select(jobs.c.tenant, func.sum(UNFINISHED))
    .where(_any(jobs.c.tenant, "b_names"), _unfinished_jobs())
    .group_by(jobs.c.tenant))
CREATE_TENANTS = Prepared(
    postgresql_insert(tenants)
    .from_select(["name", "weight", "created_at"],
                 select(func.unnest(bindparam("b_names", type_=ARRAY(String))), literal(1.0, Float),
                        bindparam("b_now", type_=Float)))
    .on_conflict_do_nothing(index_elements=["name"])
    .returning(tenants.c.name))

_JOB_FIELDS = ("tenant", "class", "priority", "name", "origin", "key_id", "num_requests")
_REQUEST_FIELDS = ("idx", "custom_id", "choice", "answer", "endpoint", "prompt", "messages", "render",
                   "params", "max_tokens", "model")


def _stored_group(guarded: bool) -> Prepared:
    """The jobs (`b_jobs`, each with its place `b_pos`) and their requests (`b_requests`) in one statement,
    returning each stored job's place and id (ids ascending in place order). `guarded`: only if every
    tenant is there, every key usable and every tenant stays within `b_limit` (else it stores nothing)."""
    new_jobs = select(recordset(column("b_pos", Integer), *(column(c, jobs.c[c].type) for c in _JOB_FIELDS),
                                param="b_jobs", name="j")).cte("j")
    kept = select(new_jobs, func.nextval(func.pg_get_serial_sequence("jobs", "id")).label("id"))
    if guarded:
        kept = kept.where(_guard(new_jobs))
    kept = kept.order_by(new_jobs.c.b_pos).cte("n")  # nextval after the sort: ids in place order
    now = bindparam("b_now", type_=Float)
    job_values = {"id": kept.c.id, **{c: kept.c[c] for c in _JOB_FIELDS}, "state": JobState.QUEUED.value,
                  **dict.fromkeys(_JOB_ZEROS, 0), "submitted_at": now}
    req = recordset(column("b_pos", Integer), *(column(c, requests.c[c].type) for c in _REQUEST_FIELDS),
                    param="b_requests", name="r")
    request_values = {"job_id": kept.c.id, **{c: req.c[c] for c in _REQUEST_FIELDS},
                      "messages": func.coalesce(req.c.messages, literal_column("'null'::json")),
                      "state": RowState.QUEUED.value, "output_tokens": literal_column("'[]'::json"),
                      "output_text": "", "num_output_tokens": 0, "num_logprobs": 0, "attempts": 0,
                      "enqueued_at": now, "lease_epoch": 0}
    return Prepared(select(kept.c.b_pos, kept.c.id).add_cte(
        _inserted(jobs, job_values, select().select_from(kept), "ij"),
        _inserted(requests, request_values,
                  select().select_from(req.join(kept, kept.c.b_pos == req.c.b_pos))
                  .order_by(req.c.b_pos, req.c.idx), "ir")))


_JOB_ZEROS = ("num_done", "num_failed", "num_cancelled", "num_running", "num_output_tokens",
              "num_prompt_tokens")


def _inserted(table, values: dict, source, name: str):
    """`INSERT INTO table (values' keys) SELECT values' values FROM source` as a CTE called `name`."""
    selected = source.add_columns(*(v if isinstance(v, ColumnElement) else literal(v, table.c[k].type)
                                    for k, v in values.items()))
    return table.insert().from_select(list(values), selected).cte(name)


def _guard(new_jobs) -> ColumnElement:
    """Every tenant of the jobs there and within the limit `b_limit` with all its jobs added, and every
    job's key usable."""
    adding = (select(new_jobs.c.tenant, func.sum(new_jobs.c.num_requests).label("adding"))
              .group_by(new_jobs.c.tenant).subquery("a"))
    have = (select(func.coalesce(func.sum(UNFINISHED), 0)).where(jobs.c.tenant == adding.c.tenant,
                                                                  _unfinished_jobs())
            .scalar_subquery())
    there = select(tenants.c.name).where(tenants.c.name == adding.c.tenant).exists()
    tenants_fit = ~select(adding.c.tenant).where(
        ~there | (have + adding.c.adding > bindparam("b_limit", type_=Integer))).exists()
    usable = select(_KEYS.c.id).where(_KEYS.c.id == new_jobs.c.key_id, _KEYS.c.revoked_at.is_(None)).exists()
    keys_usable = ~select(new_jobs.c.b_pos).where(new_jobs.c.key_id.is_not(None), ~usable).exists()
    return tenants_fit & keys_usable


STORE_GROUP_IF_ALL_FIT = _stored_group(guarded=True)
STORE_GROUP = _stored_group(guarded=False)
# What a group commit sends (PostgreSQL): prepared for the kept connection's session (storage/kept.py).
GROUP_COMMIT_STATEMENTS = (LOCK_NAMED_TENANTS, STORE_GROUP_IF_ALL_FIT, LOCK_TENANTS_READ_KEYS,
                           COUNT_UNFINISHED, CREATE_TENANTS, STORE_GROUP)


def group_commit(writer: KeptWriter, submissions: Sequence[JobSubmission], limit: int, now: float,
                 one_query: bool = True
                 ) -> tuple[list[JobSubmission | QueueFull | KeyRevoked], list[int], set[str]]:
    """Store each job on its own terms (`admit_each`), on PostgreSQL: each one's outcome, the stored jobs'
    ids in order, the tenants created. With `one_query`, one round trip when every job is stored and no
    tenant is new, else that one (which stored nothing, and still waited for its COMMIT's flush: its
    locks) and then two or three; without, two or three. (The HTTP server asks for the one query unless
    its last group commit refused a job: a tenant kept at its limit costs two round trips a group.)"""
    names = sorted({s.tenant for s in submissions})
    rows = _group_rows(submissions)
    if one_query:
        with writer.write() as tx:
            _, stored = tx.send([(LOCK_NAMED_TENANTS, {"b_names": names}),
                                 (STORE_GROUP_IF_ALL_FIT, {**rows, "b_now": now, "b_limit": limit})],
                                commit=True)
        if len(stored) == len(submissions):
            return list(submissions), [row.id for row in sorted(stored)], set()
    with writer.write() as tx:
        return _group_commit_decided(tx, submissions, names, limit, now, rows)


def _group_commit_decided(tx: Batches, submissions: Sequence[JobSubmission], names: list[str], limit: int,
                          now: float, rows: dict) -> tuple[list, list[int], set[str]]:
    key_ids = sorted({s.key_id for s in submissions if s.key_id is not None})
    found, counts = tx.send([(LOCK_TENANTS_READ_KEYS, {"b_names": names, "b_key_ids": key_ids}),
                             (COUNT_UNFINISHED, {"b_names": names})])
    existing = {name for name, is_key in found if not is_key}
    usable = {key for key, is_key in found if is_key}
    created: set[str] = set()
    if missing := sorted(set(names) - existing):  # created now, here or by another server (then locked)
        made, _, counts = tx.send([(CREATE_TENANTS, {"b_names": missing, "b_now": now}),
                                   (LOCK_NAMED_TENANTS, {"b_names": missing}),
                                   (COUNT_UNFINISHED, {"b_names": names})])
        created = {row.name for row in made}
    outcomes = admit_each(submissions, usable, Counter({t: int(n or 0) for t, n in counts}), limit)
    kept = {pos for pos, s in enumerate(outcomes) if isinstance(s, JobSubmission)}
    if not kept:
        tx.send([], commit=True)
        return outcomes, [], created
    (stored,) = tx.send([(STORE_GROUP, {
        "b_jobs": [row for row in rows["b_jobs"] if row["b_pos"] in kept],
        "b_requests": [row for row in rows["b_requests"] if row["b_pos"] in kept], "b_now": now})],
        commit=True)
    return outcomes, [row.id for row in sorted(stored)], created


def _group_rows(submissions: Sequence[JobSubmission]) -> dict[str, list[dict]]:
    """The parameters `b_jobs` and `b_requests` of `STORE_GROUP` (a job's place: `b_pos`)."""
    job_rows, request_rows = [], []
    for pos, s in enumerate(submissions):
        job = _job_row(s, 0.0)
        job_rows.append({"b_pos": pos, **{name: job[name] for name in _JOB_FIELDS}})
        for idx, spec in enumerate(s.requests):
            row = _request_row(0, idx, spec, 0.0)
            request_rows.append({"b_pos": pos, **{name: row[name] for name in _REQUEST_FIELDS}})
    return {"b_jobs": job_rows, "b_requests": request_rows}


def _bound(row: dict) -> dict:
    """A row's values as `_row_insert`'s statement names its parameters."""
    return {f"b_{k}": v for k, v in row.items()}


def _with_ids(ready: Ready, name: str, spans: Sequence[tuple[int, int]], ids: Sequence[int]) -> Ready:
    """The rows of `ready` in `spans` (each a job's: [start, end)), each with `name` set to its job's id."""
    rows = [row for start, end in spans for row in ready.rows[start:end]]
    values = [job_id for (start, end), job_id in zip(spans, ids, strict=True) for _ in range(end - start)]
    return Ready(ready.compiled, ready.compiled.with_values(rows, name, values))


# -- SQLite's group commit: the same decisions, on a connection kept for it, statements compiled once ------
#
# Through SQLAlchemy's execution (a pooled connection's checkout, each statement's cache lookup and its
# expanded lists compiled again, the events, a result object) a group commit of two online requests took
# 760 µs of the HTTP server's CPU on SQLite, against a few tens of µs in the driver. Here: the tenants there
# with their unfinished counts in one read, the usable keys in another, a tenant created only when missing,
# then all the jobs (one executemany) and all their requests (another). The jobs' ids are the ones after
# the highest there, as SQLite would give them: the transaction is the table's only writer from its
# BEGIN IMMEDIATE on. (A statement a job for its id, RETURNING it, was 12 of the 73 µs of CPU a job of a
# group of 32 cost.)

def _sqlite_tenant_counts(n: int):
    have = (select(func.coalesce(func.sum(UNFINISHED), 0))
            .where(jobs.c.tenant == tenants.c.name, _unfinished_jobs()).scalar_subquery())
    return select(tenants.c.name, have.label("unfinished")).where(listed(tenants.c.name, "b_names", n))


SQLITE_TENANT_COUNTS = Prepared(_sqlite_tenant_counts, listed="b_names")
SQLITE_USABLE_KEYS = Prepared(lambda n: select(_KEYS.c.id).where(listed(_KEYS.c.id, "b_key_ids", n),
                                                                  _KEYS.c.revoked_at.is_(None)),
                              listed="b_key_ids")
SQLITE_CREATE_TENANT = Prepared(
    sqlite_insert(tenants).values(name=bindparam("b_name"), weight=1.0, created_at=bindparam("b_now"))
    .on_conflict_do_nothing(index_elements=["name"]).returning(tenants.c.name))


def _row_insert(table, names: Sequence[str], returning=None) -> Prepared:
    """An INSERT of one row of these columns, each from the parameter `b_<column>`."""
    statement = table.insert().values({name: bindparam(f"b_{name}", type_=table.c[name].type)
                                       for name in names})
    return Prepared(statement.returning(returning) if returning is not None else statement)


_JOB_COLUMNS = ("tenant", "class", "priority", "name", "origin", "key_id", "state", "num_requests",
                *_JOB_ZEROS, "submitted_at")
_REQUEST_COLUMNS = ("job_id", "idx", "custom_id", "choice", "answer", "endpoint", "prompt", "messages",
                    "render", "params", "max_tokens", "model", "state", "output_tokens", "output_text",
                    "num_logprobs", "num_output_tokens", "attempts", "enqueued_at", "lease_epoch")
SQLITE_LAST_JOB_ID = Prepared(select(func.coalesce(func.max(jobs.c.id), 0).label("id")))
SQLITE_JOB_ROW = _row_insert(jobs, ("id", *_JOB_COLUMNS))
SQLITE_REQUEST_ROW = _row_insert(requests, _REQUEST_COLUMNS)
# What a group commit runs on SQLite, compiled when a server starts (the catalog's `prepare_submits`), the
# listed ones for groups of up to PREPARED_TENANTS tenants and keys (a longer list's variant is compiled
# the first time one comes).
SQLITE_GROUP_COMMIT_STATEMENTS = (SQLITE_TENANT_COUNTS, SQLITE_USABLE_KEYS, SQLITE_CREATE_TENANT,
                                  SQLITE_LAST_JOB_ID, SQLITE_JOB_ROW, SQLITE_REQUEST_ROW)
PREPARED_TENANTS = 8


def sqlite_group_commit(direct: DirectConnection, submissions: Sequence[JobSubmission], limit: int, now: float
                        ) -> tuple[list[JobSubmission | QueueFull | KeyRevoked], list[int], set[str]]:
    """Store each job on its own terms (`admit_each`), on SQLite: each one's outcome, the stored jobs' ids in
    order, the tenants created; one transaction (BEGIN IMMEDIATE: writers take turns)."""
    names = sorted({s.tenant for s in submissions})
    key_ids = sorted({s.key_id for s in submissions if s.key_id is not None})
    # Every row made (its values encoded) before the write lock is taken, its job's id set in the
    # transaction: while the lock is held, every other writer waits (the daemons' claims of these very
    # requests among them), and the server's event loop, busy with a burst, kept this thread from the
    # GIL for milliseconds at a time. A group of 32 online requests held the lock 2.7 ms p50 with its rows
    # made in the transaction, 1.3 ms made first (bench/write_lock.py).
    jobs_ready = direct.ready(SQLITE_JOB_ROW, [{"b_id": 0, **_bound(_job_row(s, now))} for s in submissions])
    requests_ready = direct.ready(SQLITE_REQUEST_ROW, [
        _bound(_request_row(0, idx, spec, now)) for s in submissions for idx, spec in enumerate(s.requests)])
    starts = list(accumulate((len(s.requests) for s in submissions), initial=0))
    with direct.write() as tx:
        counts = {row.name: int(row.unfinished) for row in tx.rows(SQLITE_TENANT_COUNTS, {"b_names": names})}
        usable = {row.id for row in tx.rows(SQLITE_USABLE_KEYS, {"b_key_ids": key_ids})} if key_ids else set()
        created = {name for name in names if name not in counts
                   and tx.first(SQLITE_CREATE_TENANT, {"b_name": name, "b_now": now}) is not None}
        outcomes = admit_each(submissions, usable, Counter(counts), limit)
        kept = [pos for pos, s in enumerate(outcomes) if isinstance(s, JobSubmission)]
        after = tx.first(SQLITE_LAST_JOB_ID).id if kept else 0
        job_ids = list(range(after + 1, after + 1 + len(kept)))
        tx.many_ready(_with_ids(jobs_ready, "b_id", [(pos, pos + 1) for pos in kept], job_ids))
        tx.many_ready(_with_ids(requests_ready, "b_job_id", [(starts[pos], starts[pos + 1]) for pos in kept],
                                job_ids))
        crash_point("mid_submit")
    return outcomes, job_ids, created

