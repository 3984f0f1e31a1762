"""The SQL job table itself on SQLite and PostgreSQL: one class for both sides, and its migrations.

What every store must do is in the contract suites (test_*_contract.py), run on SQLite, PostgreSQL and
in memory alike.
"""

from __future__ import annotations

import json

import pytest

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.catalog import CatalogStore
from fsched.core.ports.queue import QueueStore
from fsched.core.ports.records import JobSubmission
from fsched.core.types import RequestClass, RequestSpec, SamplingParams
from fsched.storage.jobstore import SqlJobStore


def parsed(n: int, source: str = "f.jsonl") -> tuple[RequestSpec, ...]:
    data = "".join(
        json.dumps({"prompt": f"p{i}", "custom_id": f"c{i}", "max_tokens": 4}) + "\n" for i in range(n)
    )
    return parse_job_file(data.encode(), source)


def submission(n: int = 3, tenant: str = "alice",
               request_class: RequestClass = RequestClass.BATCH) -> JobSubmission:
    return JobSubmission(parsed(n), tenant=tenant, request_class=request_class, priority=5, name="job")


@pytest.fixture
def store(db_url) -> SqlJobStore:
    store = SqlJobStore(db_url)
    yield store
    store.db.dispose()


def test_sql_stores_implement_the_core_protocols(store):
    from fsched.storage.sql_catalog import SqlCatalogStore
    from fsched.storage.sql_queue import SqlQueueStore

    assert isinstance(store, CatalogStore) and isinstance(store, QueueStore)
    assert isinstance(SqlCatalogStore(store.db), CatalogStore)
    assert isinstance(SqlQueueStore(store.db), QueueStore)


def test_schema_1_databases_are_migrated(db_url):
    from sqlalchemy import inspect, text

    from fsched.storage import schema

    store = SqlJobStore(db_url)
    store.submit([submission(2)])
    with store.db.write() as conn:  # turn it back into a version-1 database
        conn.execute(text("DROP TABLE daemon_usage"))
        conn.execute(text("DROP INDEX ix_requests_state_lease_expires"))
        conn.execute(text("CREATE TABLE tenant_usage (tenant VARCHAR(128) PRIMARY KEY, compute FLOAT)"))
        conn.execute(text("UPDATE fsched_meta SET value = '1' WHERE key = 'schema_version'"))
    assert schema.ensure_schema(store.db) == 1
    with store.db.read() as conn:
        tables = set(inspect(conn).get_table_names())
        indexes = {i["name"] for i in inspect(conn).get_indexes("requests")}
    assert "daemon_usage" in tables and "tenant_usage" not in tables
    assert "ix_requests_state_lease_expires" in indexes
    assert len(store.claim("d", per_group=5)) == 2  # the data came through
    store.db.dispose()


@pytest.mark.parametrize("rebuild", [False, True], ids=["drop-column", "rebuild"])
def test_databases_before_the_step_lose_the_mlfq_level_column_and_keep_their_rows(db_url, rebuild):
    from sqlalchemy import Column, Integer, MetaData, inspect

    from fsched.storage import schema
    from fsched.storage.db import Database
    from fsched.storage.models import Base

    before = next(v for v, step in schema.MIGRATIONS.items() if step is schema._drop_mlfq_level)
    if rebuild and not db_url.startswith("sqlite"):
        pytest.skip("copying the table is SQLite's path (before 3.35, which has no DROP COLUMN)")
    # The tables as the version before made them: requests.mlfq_level NOT NULL, no default in the table.
    old = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(old)
    old.tables["requests"].append_column(Column("mlfq_level", Integer, nullable=False))
    db = Database(db_url)
    params = SamplingParams(max_tokens=4, seed=7).to_json()
    with db.write() as conn:
        old.create_all(conn)
        conn.execute(old.tables["fsched_meta"].insert().values(key="schema_version", value=str(before)))
        conn.execute(old.tables["tenants"].insert().values(name="alice", weight=1.0, created_at=1.0))
        job_id = conn.execute(old.tables["jobs"].insert().values({
            "tenant": "alice", "class": "batch", "name": "old", "state": "queued", "num_requests": 2,
            "submitted_at": 1.0})).inserted_primary_key[0]
        conn.execute(old.tables["requests"].insert(), [
            {"job_id": job_id, "idx": i, "custom_id": f"old{i}", "endpoint": "/v1/completions",
             "prompt": f"p{i}", "params": params, "max_tokens": 4, "state": "queued", "enqueued_at": 1.0,
             "mlfq_level": 0}
            for i in range(2)])
    steps = {**schema.MIGRATIONS,
             before: lambda conn: schema.drop_column(conn, "requests", "mlfq_level", rebuild)}
    assert schema.ensure_schema(db, migrations=steps) == before
    with db.read() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("requests")}
        indexes = {i["name"] for i in inspect(conn).get_indexes("requests")}
    assert "mlfq_level" not in columns and columns == {c.name for c in Base.metadata.tables["requests"].c}
    assert {i.name for i in Base.metadata.tables["requests"].indexes} <= indexes
    store = SqlJobStore(db)
    store.submit([submission(2)])  # the rows this version writes, which the old column refused
    claimed = store.claim("d", per_group=10)
    assert sorted(c.custom_id for c in claimed) == ["c0", "c1", "old0", "old1"]
    assert {c.id for c in claimed if c.custom_id.startswith("old")} == {"1", "2"}  # ids kept
    db.dispose()
