"""A job's state as SQL (storage/counters.py `job_state_sql`, what a PostgreSQL transaction writes when it
moves its jobs in one statement) is the core's rule (`derive_job_state`) in every case, on both databases;
and the one-statement moves leave a job's row as the locking select, the rule in Python and its update do."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from sqlalchemy import Integer, bindparam, select

from fsched.core.jobs.jobstate import JobCounts, derive_job_state
from fsched.storage.counters import CountDelta, job_state_sql, move_derived, move_jobs
from fsched.storage.db import Database
from fsched.storage.direct import DirectConnection
from fsched.storage.schema import ensure_schema

NAMES = ("requests", "done", "failed", "cancelled", "running", "started", "cancel")
CASES = [c for c in itertools.product(range(1, 4), range(4), range(4), range(3), range(3), (0, 1), (0, 1))
         if c[1] + c[2] + c[3] <= c[0] + 1]  # one over: a counter ahead of its job is still derived


@pytest.fixture
def db(db_url):
    found = Database(db_url)
    ensure_schema(found)
    yield found
    found.dispose()


def test_the_sql_rule_is_the_core_rule_in_every_case(db):
    n, done, failed, cancelled, running = (bindparam(name, type_=Integer) for name in NAMES[:5])
    started, cancel = (bindparam(name, type_=Integer) == 1 for name in NAMES[5:])
    query = select(job_state_sql(n, done, failed, cancelled, running, started, cancel))
    assert len(CASES) > 500
    with db.engine.connect() as conn:
        for case in CASES:
            got = conn.execute(query, dict(zip(NAMES, case, strict=True))).scalar_one()
            requests, done_, failed_, cancelled_, running_, started_, cancel_ = case
            counts = JobCounts(num_requests=requests, num_done=done_, num_failed=failed_,
                               num_cancelled=cancelled_, num_running=running_)
            want = derive_job_state(counts, started=bool(started_), cancel_requested=bool(cancel_))
            assert got == want.value, (case, got, want)


def job_row(db: Database, job_id: int) -> tuple:
    from sqlalchemy import text

    with db.engine.connect() as conn:
        return tuple(conn.execute(text(
            "SELECT state, num_running, num_done, num_failed, num_cancelled, num_output_tokens, "
            "num_prompt_tokens, started_at, finished_at FROM jobs WHERE id = :id"), {"id": job_id}).one())


@pytest.mark.parametrize("steps", [
    [CountDelta(claimed=1), CountDelta(output_tokens=5), CountDelta(running=-1, done=1, output_tokens=3,
                                                                     prompt_tokens=7)],
    [CountDelta(claimed=2), CountDelta(running=-1, failed=1), CountDelta(running=-1, failed=1)],
    [CountDelta(claimed=1), CountDelta(running=-1, cancelled=1)],
])
def test_one_job_moved_in_one_statement_as_in_two(db, steps):
    """The same deltas through the one-job update (PostgreSQL), the several jobs' (two jobs in each
    transaction: on PostgreSQL one statement) and the locking select with the state worked out in Python
    and then written (`move_derived`, SQLite's way): the same rows, step by step."""
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission
    from fsched.core.types import JobOrigin, RequestClass
    from fsched.storage.sql_catalog import SqlCatalogStore

    store = SqlCatalogStore(db.url)
    line = '{"custom_id": "a", "prompt": "hi", "max_tokens": 4}\n'
    size = max(s.claimed for s in steps)
    specs = parse_job_file("".join(line.replace('"a"', f'"r{i}"') for i in range(size)).encode(), "batch")
    submissions = [JobSubmission(specs, "t", RequestClass.BATCH, 5, f"j{k}", JobOrigin.SUBMIT, None)
                   for k in range(4)]
    ids = [job.job_id for job in store.submit(submissions)]
    one, pair, derived = ids[0], ids[1:3], ids[3]
    direct = DirectConnection(db)
    for now, delta in enumerate(steps, start=100):
        with direct.write() as tx:
            move_jobs(tx, {one: delta}, float(now))
        with direct.write() as tx:
            move_jobs(tx, {pair[0]: delta, pair[1]: replace(delta)}, float(now))
        with direct.write() as tx:
            move_derived(tx, {derived: replace(delta)}, float(now))
        assert job_row(db, one) == job_row(db, pair[0]) == job_row(db, pair[1]) == job_row(db, derived)
    store.db.dispose()
