"""Logprobs in the SQL job table: the column's form, NULL for a request that asked for none, and a
database from before the column gaining it with its rows intact (that they are written with the tokens,
kept by a resume and read back by every read is in the serving contract, test_serving_contract.py)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, text

from fsched.core.ports.records import Completion, JobSubmission, TokenUpdate
from fsched.core.types import (
    Endpoint,
    Logprob,
    RequestClass,
    RequestSpec,
    RequestStatus,
    SamplingParams,
    TokenLogprobs,
)
from fsched.storage import schema
from fsched.storage.jobstore import SqlJobStore


def records(tokens: list[int]) -> tuple[TokenLogprobs, ...]:
    out = []
    for i, t in enumerate(tokens):
        chosen = Logprob(t, -0.5 * i, f"w{t}")
        out.append(TokenLogprobs(chosen, (chosen, Logprob(1, -9999.0, "\ufffd"))))
    return tuple(out)


def submission(logprobs: int | None) -> JobSubmission:
    specs = tuple(RequestSpec(custom_id=f"c{i}", endpoint=Endpoint.COMPLETIONS, prompt="p",
                              params=SamplingParams(max_tokens=8, logprobs=logprobs)) for i in range(2))
    return JobSubmission(tuple(specs), "alice", RequestClass.BATCH, 5, "job")


@pytest.fixture
def store(db_url):
    store = SqlJobStore(db_url)
    yield store
    store.db.dispose()


def flush_then_resume(store, logprobs_of_update):
    (job,) = store.submit([submission(2)])
    a, b = store.claim("d1", per_group=5)
    assert a.output_logprobs == () and a.params["logprobs"] == 2
    assert store.flush_tokens("d1", [TokenUpdate(a.id, (4, 5), "w4 w5", 1.0, a.lease_epoch,
                                                 logprobs_of_update((4, 5)))]) == 1
    store.release("d1")  # a daemon stops: the next claim resumes from the table
    again = {c.id: c for c in store.claim("d2", per_group=5)}
    return job, a, b, again


def test_logprobs_are_stored_as_plain_json(store):
    """Written with the tokens and read back by every read (the serving contract); in the column as plain
    JSON, with no infinity, which neither JSON nor PostgreSQL takes."""
    _, a, _, again = flush_then_resume(store, records)
    final = Completion(a.id, RequestStatus.FINISHED_STOPPED, (4, 5, 6), "w4 w5 w6", 1, "m",
                       lease_epoch=again[a.id].lease_epoch, logprobs=records([4, 5, 6]))
    assert store.finish_requests([final], "d2") == [True]
    with store.db.read() as conn:
        raw = conn.execute(text("SELECT output_logprobs FROM requests WHERE id = :id"),
                           {"id": int(a.id)}).scalar()
    stored = raw if isinstance(raw, list) else json.loads(raw)
    assert stored[0] == [4, 0.0, "w4", [[4, 0.0, "w4"], [1, -9999.0, "\ufffd"]]]


def test_a_request_without_logprobs_stores_null(store):
    store.submit([submission(None)])
    a, _ = store.claim("d", per_group=5)
    store.flush_tokens("d", [TokenUpdate(a.id, (1,), "w1", 1.0, a.lease_epoch)])
    with store.db.read() as conn:
        values = conn.execute(text("SELECT output_logprobs FROM requests")).scalars().all()
    assert values == [None, None]


def test_a_schema_3_table_gains_the_column_and_keeps_its_rows(store):
    job, a, _, _ = flush_then_resume(store, lambda tokens: ())
    with store.db.write() as conn:  # back to a version-3 table, rows and all
        conn.execute(text("ALTER TABLE requests DROP COLUMN output_logprobs"))
        conn.execute(text("UPDATE fsched_meta SET value = '3' WHERE key = 'schema_version'"))
    assert schema.ensure_schema(store.db) == 3
    with store.db.read() as conn:
        assert "output_logprobs" in {c["name"] for c in inspect(conn).get_columns("requests")}
    store.release("d2")
    resumed = {c.id: c for c in store.claim("d3", per_group=5)}
    assert resumed[a.id].output_tokens == [4, 5] and resumed[a.id].output_logprobs == ()
    assert store.flush_tokens("d3", [TokenUpdate(a.id, (4, 5, 7), "", 1.0, resumed[a.id].lease_epoch,
                                                 records([4, 5, 7]))]) == 1
    store.release("d3")
    assert {c.id: c for c in store.claim("d4", per_group=5)}[a.id].output_logprobs == records([4, 5, 7])
    assert schema.ensure_schema(store.db) == schema.SCHEMA_VERSION
