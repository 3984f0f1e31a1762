"""A schema-4 table gains the columns of several choices a line, with its rows (how lines of several
choices are stored and read back is in the catalog contract, test_catalog_contract.py)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, text

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import Completion, JobSubmission
from fsched.core.types import RequestClass, RequestStatus
from fsched.storage import schema
from fsched.storage.jobstore import SqlJobStore


@pytest.fixture
def store(db_url):
    store = SqlJobStore(db_url)
    yield store
    store.db.dispose()


def batch(*bodies: dict) -> JobSubmission:
    lines = [json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/completions", "body": b})
             for i, b in enumerate(bodies)]
    parsed = parse_job_file(("\n".join(lines) + "\n").encode(), "f.jsonl")
    return JobSubmission(parsed, "alice", RequestClass.BATCH, 5, "job")


def finish(store, claimed, state=RequestStatus.FINISHED_STOPPED, text_of=lambda c: f"t{c.id}"):
    done = [Completion(c.id, state, (7, 8), text_of(c), 3, "m", lease_epoch=c.lease_epoch,
                       error=None if state.succeeded else "broke")
            for c in claimed]
    assert all(store.finish_requests(done, "d"))


def test_a_schema_4_table_gains_the_columns_and_keeps_its_rows(store):
    (job,) = store.submit([batch({"prompt": "p"}, {"prompt": "q", "max_tokens": 3})])
    with store.db.write() as conn:  # back to a version-4 table: no choice, no answer, the old key
        _to_schema_4(conn)
    assert schema.ensure_schema(store.db) == 4
    with store.db.read() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("requests")}
        uniques = {u["name"] for u in inspect(conn).get_unique_constraints("requests")}
        indexes = {i["name"] for i in inspect(conn).get_indexes("requests")}
    assert {"choice", "answer"} <= columns and "uq_requests_job_custom_id_choice" in uniques
    assert "ix_requests_job_state_idx" in indexes
    claimed = sorted(store.claim("d", per_group=10), key=lambda c: c.custom_id)
    assert [c.custom_id for c in claimed] == ["l0", "l1"] and claimed[1].params.max_tokens == 3
    finish(store, claimed)
    assert [r.choice for r in store.iter_results(job.job_id)] == [0, 0]
    (more,) = store.submit([batch({"prompt": "p", "n": 2})])
    assert more.num_requests == 2


def _to_schema_4(conn) -> None:
    for later in ("request_output", "request_logprobs"):  # tables a later version adds (SQLite's rebuild
        conn.execute(text(f"DROP TABLE {later}"))        # of `requests` would take their keys with it)
    if conn.dialect.name == "postgresql":
        conn.execute(text("ALTER TABLE requests DROP CONSTRAINT uq_requests_job_custom_id_choice"))
        conn.execute(text("ALTER TABLE requests DROP COLUMN choice"))
        conn.execute(text("ALTER TABLE requests DROP COLUMN answer"))
        conn.execute(text("ALTER TABLE requests ADD CONSTRAINT uq_requests_job_custom_id "
                          "UNIQUE (job_id, custom_id)"))
    else:
        (ddl,) = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'requests'")).one()
        old = (ddl.replace("\tchoice INTEGER DEFAULT '0' NOT NULL, \n", "")
               .replace("\tanswer JSON, \n", "")
               .replace("CONSTRAINT uq_requests_job_custom_id_choice UNIQUE (job_id, custom_id, choice)",
                        "CONSTRAINT uq_requests_job_custom_id UNIQUE (job_id, custom_id)")
               .replace("CREATE TABLE requests", "CREATE TABLE requests_old"))
        assert "choice" not in old and "answer" not in old, old
        conn.execute(text(old))
        columns = ", ".join(c["name"] for c in inspect(conn).get_columns("requests_old"))
        conn.execute(text(f"INSERT INTO requests_old ({columns}) SELECT {columns} FROM requests"))
        conn.execute(text("DROP TABLE requests"))
        conn.execute(text("ALTER TABLE requests_old RENAME TO requests"))
    conn.execute(text("UPDATE fsched_meta SET value = '4' WHERE key = 'schema_version'"))
