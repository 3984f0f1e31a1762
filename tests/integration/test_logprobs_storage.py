"""Logprobs in the SQL job table: appended in pieces, none for a request that asked for none, and
databases from before (no logprobs; one column a request) upgraded with their rows intact (that they are
written with the tokens, kept by a resume and read back by every read is in the serving contract,
test_serving_contract.py)."""

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
    assert tuple(a.resumed_logprobs) == () and a.params.logprobs == 2
    assert store.flush_tokens("d1", [TokenUpdate(a.id, (4, 5), "w4 w5", 1.0, a.lease_epoch,
                                                 logprobs_of_update((4, 5)))]) == 1
    store.release("d1")  # a daemon stops: the next claim resumes from the table
    again = {c.id: c for c in store.claim("d2", per_group=5)}
    return job, a, b, again


def pieces(store) -> list[tuple[int, int, list]]:
    with store.db.read() as conn:
        rows = conn.execute(text("SELECT request_id, start, records FROM request_logprobs "
                                 "ORDER BY request_id, start")).all()
    return [(key, at, raw if isinstance(raw, list) else json.loads(raw)) for key, at, raw in rows]


def test_logprobs_are_appended_in_pieces_of_plain_json(store):
    """Each write appends the records of its new tokens only (never rewrites the stored ones), as plain
    JSON with no infinity, which neither JSON nor PostgreSQL takes; a resume and every read get them all."""
    job, a, _, again = flush_then_resume(store, records)
    epoch = again[a.id].lease_epoch
    assert store.flush_tokens("d2", [TokenUpdate(a.id, (4, 5, 6), "", 1.0, epoch, records([4, 5, 6]))]) == 1
    final = Completion(a.id, RequestStatus.FINISHED_STOPPED, (4, 5, 6, 7), "w4 w5 w6 w7", 1, "m",
                       lease_epoch=epoch, logprobs=records([4, 5, 6, 7]))
    assert store.finish_requests([final], "d2") == [True]
    stored = pieces(store)
    assert [(at, len(r)) for _, at, r in stored] == [(0, 2), (2, 1), (3, 1)]
    assert stored[0][2][0] == [4, 0.0, "w4", [[4, 0.0, "w4"], [1, -9999.0, "\ufffd"]]]
    (progress, _) = store.request_progress(job.job_id)
    assert progress.logprobs == records([4, 5, 6, 7])
    (result,) = [r for r in store.iter_results(job.job_id) if r.id == a.id]
    assert result.logprobs == records([4, 5, 6, 7])


def test_a_request_without_logprobs_stores_none(store):
    store.submit([submission(None)])
    a, _ = store.claim("d", per_group=5)
    store.flush_tokens("d", [TokenUpdate(a.id, (1,), "w1", 1.0, a.lease_epoch)])
    with store.db.read() as conn:
        counts = conn.execute(text("SELECT num_logprobs FROM requests")).scalars().all()
    assert counts == [0, 0] and pieces(store) == []


def back_to(store, version: int, column: bool) -> None:
    """The table as an older fsched left it: logprobs in one column a request (if `column`)."""
    with store.db.write() as conn:
        values = {key: [] for key in conn.execute(text("SELECT id FROM requests")).scalars()}
        for key, _, records_ in pieces(store):
            values[key] += records_
        conn.execute(text("DROP TABLE request_logprobs"))
        conn.execute(text("ALTER TABLE requests DROP COLUMN num_logprobs"))
        if column:
            conn.execute(text("ALTER TABLE requests ADD COLUMN output_logprobs JSON"))
            for key, value in values.items():
                conn.execute(text("UPDATE requests SET output_logprobs = :v WHERE id = :id"),
                             {"v": json.dumps(value) if value else None, "id": key})
        conn.execute(text("UPDATE fsched_meta SET value = :v WHERE key = 'schema_version'"),
                     {"v": str(version)})


def test_a_schema_9_table_moves_its_logprobs_into_pieces(store):
    _, a, b, _ = flush_then_resume(store, records)
    back_to(store, 9, column=True)
    assert schema.ensure_schema(store.db) == 9
    with store.db.read() as conn:
        assert "output_logprobs" not in {c["name"] for c in inspect(conn).get_columns("requests")}
    store.release("d2")
    resumed = {c.id: c for c in store.claim("d3", per_group=5)}
    assert tuple(resumed[a.id].resumed_logprobs) == records([4, 5])
    assert tuple(resumed[b.id].resumed_logprobs) == ()
    assert store.flush_tokens("d3", [TokenUpdate(a.id, (4, 5, 7), "", 1.0, resumed[a.id].lease_epoch,
                                                 records([4, 5, 7]))]) == 1
    assert [(at, len(r)) for _, at, r in pieces(store)] == [(0, 2), (2, 1)]


def test_a_schema_3_table_gains_the_pieces_and_keeps_its_rows(store):
    job, a, _, _ = flush_then_resume(store, lambda tokens: ())
    back_to(store, 3, column=False)
    assert schema.ensure_schema(store.db) == 3
    store.release("d2")
    resumed = {c.id: c for c in store.claim("d3", per_group=5)}
    assert resumed[a.id].resumed == [4, 5] and tuple(resumed[a.id].resumed_logprobs) == ()
    assert store.flush_tokens("d3", [TokenUpdate(a.id, (4, 5, 7), "", 1.0, resumed[a.id].lease_epoch,
                                                 records([4, 5, 7]))]) == 1
    store.release("d3")
    again = {c.id: c for c in store.claim("d4", per_group=5)}
    assert tuple(again[a.id].resumed_logprobs) == records([4, 5, 7])
    assert schema.ensure_schema(store.db) == schema.SCHEMA_VERSION


def test_the_servers_poll_reads_each_piece_once(store, monkeypatch):
    """The HTTP server polls its open requests every few ms: each poll reads only the pieces appended
    since the last, and the whole logprobs still come back each time."""
    from fsched.storage import sql_serving
    from fsched.storage.sql_serving import SqlServingStore

    asked = []

    def read(conn, keys, since=None):
        asked.append(dict(since or {}))
        return real(conn, keys, since)

    real = sql_serving.read_logprobs
    monkeypatch.setattr(sql_serving, "read_logprobs", read)
    serving = SqlServingStore(store.db)
    job, a, b, again = flush_then_resume(store, records)
    key = int(a.id)
    assert serving.progress([job.job_id])[job.job_id][0].logprobs == records([4, 5])
    epoch = again[a.id].lease_epoch
    store.flush_tokens("d2", [TokenUpdate(a.id, (4, 5, 6), "", 1.0, epoch, records([4, 5, 6]))])
    assert serving.progress([job.job_id])[job.job_id][0].logprobs == records([4, 5, 6])
    assert serving.progress([job.job_id])[job.job_id][0].logprobs == records([4, 5, 6])  # nothing new
    assert asked == [{}, {key: 2}]
    final = Completion(a.id, RequestStatus.FINISHED_STOPPED, (4, 5, 6, 7), "", 1, "m", lease_epoch=epoch,
                       logprobs=records([4, 5, 6, 7]))
    store.finish_requests([final], "d2")
    assert serving.progress([job.job_id])[job.job_id][0].logprobs == records([4, 5, 6, 7])
    assert asked[-1] == {key: 3} and key not in serving._logprobs  # read for the last time: dropped
