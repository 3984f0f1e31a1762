"""The hot statements that pick unfinished jobs keep to them in PostgreSQL's generic plan: a prepared
statement's plan after five runs, made once for any parameters. The job states they name are written
into the statement (storage/prepared.py `one_of`), so that plan, too, reads the state index for the few
unfinished jobs, and never walks the finished history a long-lived queue keeps (every online request
stays a finished job)."""

from __future__ import annotations

import json
import re

import pytest
from psycopg import ClientCursor
from sqlalchemy import column, text

from fsched.storage.claim import CANDIDATE_JOBS
from fsched.storage.db import Database
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.prepared import one_of
from fsched.storage.submit import COUNT_UNFINISHED

FINISHED = 20_000  # jobs of the past: a day of online requests at a quiet rate


def _history(pg_url: str) -> Database:
    """A table of FINISHED completed jobs of tenant `carol` and three queued ones, analyzed."""
    SqlJobStore(pg_url).db.dispose()  # the schema
    db = Database(pg_url)
    with db.write() as conn:
        conn.execute(text(
            "INSERT INTO jobs (tenant, class, priority, name, origin, num_requests, state, num_done, "
            "num_failed, num_cancelled, num_running, num_output_tokens, num_prompt_tokens, submitted_at) "
            "SELECT 'carol', 'realtime', 5, 'http', 'online', 1, s, d, 0, 0, 0, 0, 0, 0 "
            "FROM (SELECT CASE WHEN g <= :finished THEN 'completed' ELSE 'queued' END AS s, "
            "CASE WHEN g <= :finished THEN 1 ELSE 0 END AS d FROM generate_series(1, :all) g) x"),
            {"finished": FINISHED, "all": FINISHED + 3})
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE jobs"))
    return db


def _generic_plan(db: Database, prepared, params: dict) -> dict:
    """The statement's generic plan, run (EXPLAIN ANALYZE of a PREPAREd statement under
    plan_cache_mode = force_generic_plan), as JSON."""
    compiled, bound = prepared.bound(db.engine.dialect, params)  # every parameter, constants' too
    names: list[str] = []

    def numbered(match: re.Match) -> str:  # the driver's %(name)s as PREPARE's $n
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    sql = re.sub(r"%\((\w+)\)s", numbered, compiled.sql)
    with db.engine.connect() as conn:
        raw = conn.connection.driver_connection
        raw.execute("SET plan_cache_mode = force_generic_plan")
        raw.execute(f"PREPARE probe AS {sql}")
        cursor = ClientCursor(raw)  # EXECUTE's own arguments bound into its text: they have no types
        arguments = ", ".join("%s" for _ in names)
        (plan,) = cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe({arguments})",
                                 [bound[name] for name in names]).fetchone()
        raw.execute("DEALLOCATE probe")
        raw.rollback()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


def _rows_read(plan: dict) -> int:
    """Rows the plan's scans of jobs produced or threw away (what it read of the table)."""
    own = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0) \
        if plan.get("Relation Name") == "jobs" else 0
    return own + sum(_rows_read(child) for child in plan.get("Plans", ()))


def test_the_claims_candidate_jobs_read_only_the_unfinished_ones(pg_url):
    db = _history(pg_url)
    plan = _generic_plan(db, CANDIDATE_JOBS, {})
    assert _rows_read(plan) <= 10  # the three queued jobs (with the job states bound: all 20,003)
    db.dispose()


def test_the_group_commits_count_of_unfinished_jobs_reads_only_them(pg_url):
    db = _history(pg_url)
    plan = _generic_plan(db, COUNT_UNFINISHED, {"b_names": ["carol"]})
    assert _rows_read(plan) <= 10
    db.dispose()


def test_one_of_writes_only_plain_names_into_a_statement():
    with pytest.raises(ValueError):
        one_of(column("state"), ["queued", "x'; DROP TABLE jobs; --"])
