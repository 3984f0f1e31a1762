"""The HTTP server's group commit of online requests on PostgreSQL: every request of a group waits for each
round trip of its transaction, counted here in the driver's own protocol trace; and the connection kept
for it, lost, costs no request."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace

import pytest
from sqlalchemy import text

from fsched.api.submitter import Submitter
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission, KeyRevoked, QueueFull, StorageError, SubmittedJob
from fsched.core.types import JobOrigin, RequestClass
from fsched.storage import kept
from fsched.storage.session import SessionStatements
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_keys import SqlKeyStore
from fsched.storage.submit import GROUP_COMMIT_STATEMENTS, LOCK_NAMED_TENANTS, TENANTS_LOCKED, insert_job
from tests.support.pgtrace import Traced
from tests.support.tables import submission


@pytest.fixture
def store(pg_url, monkeypatch):
    monkeypatch.setattr(kept, "PING_IDLE_S", 3600.0)  # no ping, however slow the machine
    made = SqlCatalogStore(pg_url)
    yield made
    made.db.dispose()  # the kept connection too: the database can be dropped


def test_a_group_commit_is_one_round_trip(store, tmp_path):
    """BEGIN, the tenants locked, the jobs and their requests stored (their counts and keys checked in
    that statement), COMMIT: one query. No ping, no idle limit set."""
    traced = Traced(store, tmp_path / "trace")
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)  # the tenant, a connection
    group = [submission(1, "carol") for _ in range(5)] + [submission(2, "dave")]
    store.submit_each([submission(1, "dave")], max_queued_per_tenant=100)
    outcomes: list = []
    trips = traced.round_trips(lambda: outcomes.extend(store.submit_each(group, max_queued_per_tenant=100)))
    assert trips == 1
    assert all(isinstance(o, SubmittedJob) for o in outcomes)
    assert [o.tenant for o in outcomes] == ["carol"] * 5 + ["dave"]
    ids = [o.job_id for o in outcomes]
    assert ids == sorted(ids) and len(set(ids)) == 6  # in the group's order
    assert [store.list_jobs(job_id=i)[0].counts.num_requests for i in ids] == [1] * 5 + [2]


def test_a_group_commit_with_a_job_refused_is_three_round_trips(store, tmp_path):
    """The one query stores nothing when a job is over its limit or its key is not usable; then the tenants
    locked with the keys read and their counts, and the jobs kept with COMMIT: two more."""
    traced = Traced(store, tmp_path / "trace")
    store.submit_each([submission(2, "carol")], max_queued_per_tenant=100)
    keys = SqlKeyStore(store.db)
    key, _ = keys.create_key("carol", RequestClass.REALTIME)
    gone, _ = keys.create_key("carol", RequestClass.REALTIME)
    keys.revoke_key(gone.id)
    group = [replace(submission(1, "carol"), key_id=key.id), submission(2, "carol"),
             replace(submission(1, "carol"), key_id=gone.id), submission(1, "carol")]
    outcomes: list = []
    trips = traced.round_trips(lambda: outcomes.extend(store.submit_each(group, max_queued_per_tenant=4)))
    assert trips == 3
    first, over, revoked, last = outcomes
    assert isinstance(over, QueueFull) and "has 3 unfinished" in str(over)  # 2 + the first: 3 + 2 > 4
    assert isinstance(revoked, KeyRevoked) and revoked.key_id == gone.id
    assert isinstance(first, SubmittedJob) and isinstance(last, SubmittedJob) and last.job_id > first.job_id
    assert store.list_tenants()[0].queued == 4
    # After a refusal the next group goes straight to those two (no query storing nothing), then one again.
    def one_more() -> None:
        (stored,) = store.submit_each([submission(1, "carol")], max_queued_per_tenant=9)
        assert isinstance(stored, SubmittedJob)

    assert traced.round_trips(one_more) == 2
    assert traced.round_trips(one_more) == 1
    assert store.list_tenants()[0].queued == 6


def test_a_group_commit_with_a_new_tenant_is_four_round_trips(store, tmp_path):
    """The one query, the tenants locked with the keys read and their counts, the new tenant created and
    locked and the counts again, the jobs with COMMIT."""
    traced = Traced(store, tmp_path / "trace")
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    group = [submission(1, "carol"), submission(1, "erin"), submission(1, "erin")]
    outcomes: list = []
    trips = traced.round_trips(lambda: outcomes.extend(store.submit_each(group, max_queued_per_tenant=100)))
    assert trips == 4
    assert [(o.tenant, o.tenant_created) for o in outcomes] == [
        ("carol", False), ("erin", True), ("erin", True)]
    assert {t.name: t.queued for t in store.list_tenants()} == {"carol": 2, "erin": 2}


def test_a_group_commits_statements_are_planned_once_for_the_kept_connection(store, tmp_path):
    """Prepared (SQL's PREPARE) when the kept connection is made, its parameters typed as the driver binds
    them, then run by name in the one query; a statement the server cannot prepare goes as text."""
    traced = Traced(store, tmp_path / "trace")
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)  # the connection: prepared
    start = traced.path.stat().st_size
    one = [submission(1, "carol")]
    assert traced.round_trips(lambda: store.submit_each(one, max_queued_per_tenant=100)) == 1
    with open(traced.path) as f:
        f.seek(start)
        (query,) = [line for line in f if line.startswith("F\t") and "\tQuery\t" in line]
    assert "EXECUTE fsched_" in query and "PREPARE" not in query and "INSERT" not in query
    prepared = store._group_writer._kept.raw.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared[0] == len(GROUP_COMMIT_STATEMENTS)
    # After a rollback (the driver may have deallocated them) they are prepared again; those still there
    # are taken as they are, and the group commit runs them by name.
    store._group_writer._session.forget()
    assert traced.round_trips(lambda: store.submit_each(one, max_queued_per_tenant=100)) > 1
    assert traced.round_trips(lambda: store.submit_each(one, max_queued_per_tenant=100)) == 1
    assert store._group_writer._session.by_name(*LOCK_NAMED_TENANTS.bound(
        store.db.engine.dialect, {"b_names": ["carol"]})) is not None

    from sqlalchemy import bindparam, select

    from fsched.storage.prepared import Prepared

    ambiguous = Prepared(select(bindparam("b_x") + bindparam("b_y")))  # unknown + unknown: no plan
    dialect = store.db.engine.dialect
    fresh = store.db.engine.raw_connection()
    try:
        fresh.driver_connection.autocommit = True
        session = SessionStatements(fresh.driver_connection)
        session.prepare_all([ambiguous.compiled(dialect), LOCK_NAMED_TENANTS.compiled(dialect)])
        lock = session.by_name(*LOCK_NAMED_TENANTS.bound(dialect, {"b_names": ["carol"]}))
        assert lock is not None and lock.startswith("EXECUTE fsched_") and "carol" in lock
        assert session.by_name(*ambiguous.bound(dialect, {"b_x": 1, "b_y": 2})) is None  # sent as text
        assert fresh.driver_connection.execute(lock).fetchall() == [("carol",)]
    finally:
        fresh.invalidate()


def test_a_group_commit_behind_a_pooler_in_transaction_mode_goes_as_text(store, caplog):
    """Prepared statements gone between two transactions with no rollback between (a pooler such as
    PgBouncer's in transaction mode gives each transaction another server session): that group commit
    fails (its server's group writer stores its requests again one by one), and from then on the
    statements go as text, with one warning."""
    import psycopg

    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)  # prepared
    store._group_writer._kept.raw.execute("DEALLOCATE ALL")  # what another server session looks like
    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    assert "prepared statements do not last" in caplog.text
    (stored,) = store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    assert isinstance(stored, SubmittedJob)
    lock = LOCK_NAMED_TENANTS.bound(store.db.engine.dialect, {"b_names": ["carol"]})
    assert store._group_writer._session.by_name(*lock) is None
    assert [t.queued for t in store.list_tenants()] == [2]
    store._group_writer._session.forget()  # a later rollback prepares nothing again
    (stored,) = store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    assert isinstance(stored, SubmittedJob) and store._group_writer._session.by_name(*lock) is None
    assert [t.queued for t in store.list_tenants()] == [3]


def _jobs_of_every_kind(key_id: str) -> list[JobSubmission]:
    def parsed(*lines: dict) -> tuple:
        return parse_job_file("".join(json.dumps(line) + "\n" for line in lines).encode(), "f.jsonl")

    chats = parsed(
        {"custom_id": "a\ufdd0x", "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": "m", "messages": [{"role": "user", "content": "h\u00e9 \U0001f600 %s 'q' \\"}], "n": 2,
            "seed": 7, "max_tokens": 5, "logprobs": True, "top_logprobs": 2}},
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "seed": 3,
            "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}}})
    prompts = parsed({"custom_id": "b", "prompt": "p'q\\ \ufdd0 %(x)s", "max_tokens": 3, "seed": 1})
    return [JobSubmission(chats, "carol", RequestClass.REALTIME, 3, "chat", JobOrigin.ONLINE, key_id),
            JobSubmission(prompts, "carol", RequestClass.BATCH, 5, "n\u00e4me", JobOrigin.SUBMIT, None)]


def test_a_group_commit_stores_the_rows_a_submit_stores(store):
    """Column for column (but ids and times), the JSON columns' very text too."""
    (key, _) = SqlKeyStore(store.db).create_key("carol", RequestClass.REALTIME)
    grouped = store.submit_each(_jobs_of_every_kind(key.id), max_queued_per_tenant=100)
    submitted = store.submit(_jobs_of_every_kind(key.id))
    assert all(isinstance(o, SubmittedJob) for o in grouped)

    def rows(job_ids: list[int]) -> list:
        with store.db.read() as conn:
            requests = conn.execute(text(
                "SELECT to_jsonb(r) - 'id' - 'job_id' - 'enqueued_at', messages::text, params::text, "
                "answer::text, render::text, output_tokens::text FROM requests r WHERE job_id = ANY(:ids) "
                "ORDER BY id"), {"ids": job_ids}).all()
            jobs = conn.execute(text(
                "SELECT to_jsonb(j) - 'id' - 'submitted_at' FROM jobs j WHERE id = ANY(:ids) ORDER BY id"),
                {"ids": job_ids}).all()
        return [tuple(r) for r in requests] + [tuple(j) for j in jobs]

    stored = rows([o.job_id for o in grouped])
    assert len(stored) == 4 + 2 and stored == rows([o.job_id for o in submitted])
    assert stored[3][1] == "null"  # a prompt's messages: JSON's null, as SQLAlchemy stores None


def test_a_busy_kept_connection_sends_a_group_commit_on_a_pooled_one(store):
    """Another thread's group commit on the kept connection: this one on a pooled connection, given back
    to the pool as the pool hands connections out."""
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    with store._group_writer._lock:  # the kept connection busy
        (stored,) = store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
        over = store.submit_each([submission(1, "carol")], max_queued_per_tenant=2)
    assert isinstance(stored, SubmittedJob) and isinstance(over[0], QueueFull)
    with store.db.write() as conn:  # the pooled connection: a transaction as SQLAlchemy's again
        assert not conn.connection.driver_connection.autocommit
        insert_job(conn, submission(1, "carol"), time.time())
        conn.rollback()
    assert store.list_tenants()[0].queued == 2


def test_a_group_commit_waits_for_another_servers_and_counts_its_jobs(store, pg_url):
    """Two servers on one table: the tenants are locked in the statement that reads the keys, so a
    group commit waits for the other server's under way, then counts its jobs in the queue limit."""
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=2)
    other = SqlCatalogStore(pg_url)
    outcomes: list = []
    submitting = threading.Thread(target=lambda: outcomes.extend(
        store.submit_each([submission(1, "carol")], max_queued_per_tenant=2)))
    try:
        with other.db.write() as conn:  # the other server's group commit: carol locked, a job added
            conn.execute(TENANTS_LOCKED, {"b_names": ["carol"]})
            insert_job(conn, submission(1, "carol"), time.time())
            submitting.start()
            deadline = time.monotonic() + 30
            while not _waits_on_a_lock(other):
                assert submitting.is_alive(), "stored without waiting for the lock"
                assert time.monotonic() < deadline
                time.sleep(0.01)
        submitting.join()
    finally:
        other.db.dispose()
    (over,) = outcomes
    assert isinstance(over, QueueFull) and "has 2 unfinished" in str(over)


def _waits_on_a_lock(store) -> bool:
    with store.db.read() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).scalar())


def _end_other_sessions(store) -> None:
    with store.db.read() as conn:
        conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")).all()
    store.db.engine.dispose()  # the pool's own are gone too: only the kept one is left to find out


def test_a_kept_connection_the_server_ended_while_idle_is_replaced_before_use(store, monkeypatch):
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    monkeypatch.setattr(store._group_writer, "ping_idle_s", 0.0)  # idle long enough: pinged
    _end_other_sessions(store)
    (stored,) = store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    assert isinstance(stored, SubmittedJob)


def test_a_kept_connection_lost_mid_use_costs_the_server_no_request(store):
    store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    _end_other_sessions(store)
    with pytest.raises(StorageError):  # not pinged (in use a moment ago): the transaction finds out
        store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
    _end_other_sessions(store)

    async def serve_three() -> list:
        submitter = Submitter(store.submit_each)
        return await asyncio.gather(*(submitter.submit(submission(1, "carol"), 100) for _ in range(3)))

    assert all(isinstance(o, SubmittedJob) for o in asyncio.run(serve_three()))
    assert len(store.list_jobs(tenant="carol")) == 4


def test_a_group_commit_stores_hostile_text_as_a_submit_does(store):
    """The group commit binds its parameters into the query's text: quotes, backslashes, dollar quotes,
    placeholders and comments in a prompt, a custom id or a job name are stored as sent."""
    hostile = ["q'uo\"te\\back $$ $1 %s %(x)s ;-- DROP TABLE jobs", "E'\\\\x00' /* */", "é漢字🙂\n\t\r"]

    def job(prompt: str) -> JobSubmission:
        line = json.dumps({"prompt": prompt, "custom_id": prompt[:20], "max_tokens": 4}) + "\n"
        return JobSubmission(parse_job_file(line.encode(), "f.jsonl"), "carol", RequestClass.BATCH, 5,
                             prompt[:30])

    grouped = store.submit_each([job(p) for p in hostile], max_queued_per_tenant=100)
    assert all(isinstance(o, SubmittedJob) for o in grouped)
    with store.db.read() as conn:
        stored = conn.execute(text(
            "SELECT r.prompt, r.custom_id, j.name FROM requests r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.id = ANY(:ids) ORDER BY j.id"), {"ids": [o.job_id for o in grouped]}).all()
    assert [tuple(row) for row in stored] == [(p, p[:20], p[:30]) for p in hostile]
