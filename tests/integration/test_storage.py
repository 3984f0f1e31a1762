"""The job table on real SQLite and PostgreSQL: submit, counters, cancel, results, tenants."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy.exc import IntegrityError

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.catalog import CatalogStore
from fsched.core.ports.queue import QueueStore
from fsched.core.ports.records import (
    JobSubmission,
    StoreError,
    TenantBusy,
    TenantExists,
    UnknownJob,
    UnknownTenant,
)
from fsched.core.types import Endpoint, JobState, RequestClass, RequestSpec, RequestState, SamplingParams
from fsched.storage import sql_catalog as catalog_module
from fsched.storage.jobstore import SqlJobStore
from tests.support.store import finish


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


def test_submit_stores_job_requests_and_new_tenant(store):
    (job,) = store.submit([submission(3)])
    assert job.num_requests == 3 and job.tenant_created
    (second,) = store.submit([submission(2)])
    assert not second.tenant_created and second.job_id > job.job_id
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.state is JobState.QUEUED and summary.counts.num_waiting == 3
    (tenant,) = store.list_tenants()
    assert (tenant.name, tenant.weight, tenant.active_jobs, tenant.queued) == ("alice", 1.0, 2, 5)


def test_every_stored_request_has_a_seed(store):
    store.submit([submission(5)])
    claimed = store.claim("d", per_group=10)
    seeds = [c.params["seed"] for c in claimed]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == 5


def test_submit_is_all_or_nothing(store):
    bad = tuple(
        RequestSpec(custom_id="same", endpoint=Endpoint.COMPLETIONS, params=SamplingParams(4), prompt="x")
        for _ in range(2)
    )
    good = submission(3, tenant="bob")
    with pytest.raises(IntegrityError):  # the database's unique constraint
        store.submit([good, JobSubmission(bad, "carol", RequestClass.BATCH, 5, "bad")])
    assert store.list_jobs() == [] and store.list_tenants() == []


def test_claim_finish_and_counters(store):
    (job,) = store.submit([submission(3)])
    claimed = store.claim("daemon-1", per_group=2)
    assert [c.custom_id for c in claimed] == ["c0", "c1"]
    assert store.list_jobs(job_id=job.job_id)[0].state is JobState.IN_PROGRESS
    assert finish(store, claimed[0].id, RequestState.DONE, [5, 6, 7], "abc", "length", 3, "tiny")
    # No request ends twice: a second finish changes nothing.
    assert not finish(store, claimed[0].id, RequestState.FAILED, error="late")
    assert finish(store, claimed[1].id, RequestState.FAILED, error="boom")
    summary = store.list_jobs(job_id=job.job_id)[0]
    c = summary.counts
    assert (c.num_done, c.num_failed, c.num_running, c.num_waiting) == (1, 1, 0, 1)
    assert summary.num_output_tokens == 3
    (rest,) = store.claim("daemon-1", per_group=5)
    finish(store, rest.id, RequestState.DONE, [1], "z")
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.state is JobState.COMPLETED and summary.finished_at is not None


def test_cancel_waiting_at_once_and_running_by_the_daemon(store):
    (job,) = store.submit([submission(4)])
    running = store.claim("d", per_group=2)
    finish(store, running[0].id, RequestState.DONE, [1, 2], "ok")
    outcome = store.cancel_job(job.job_id)
    assert (outcome.cancelled_now, outcome.stopping, outcome.state) == (2, 1, JobState.CANCELLING)
    assert store.claim("d", per_group=10) == []  # nothing of a cancelled job is claimed again
    finish(store, running[1].id, RequestState.CANCELLED, [3], "c")
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.state is JobState.CANCELLED
    assert [r.output_text for r in store.iter_results(job.job_id)] == ["ok"]  # finished work kept
    assert len(list(store.iter_results(job.job_id, errors=True))) == 3
    again = store.cancel_job(job.job_id)
    assert again.already_finished and again.state is JobState.CANCELLED


def test_unknown_job(store):
    with pytest.raises(UnknownJob, match="no job with id 42"):
        store.cancel_job(42)
    with pytest.raises(UnknownJob):
        store.list_jobs(job_id=42)
    with pytest.raises(UnknownJob):
        list(store.iter_results(42))


def test_results_in_input_order_across_pages(store, monkeypatch):
    monkeypatch.setattr(catalog_module, "RESULTS_BATCH", 7)
    (job,) = store.submit([submission(30)])
    claimed = store.claim("d", per_group=30)
    for c in reversed(claimed):  # finish in reverse order
        finish(store, c.id, RequestState.DONE, [1], c.custom_id)
    assert [r.custom_id for r in store.iter_results(job.job_id)] == [f"c{i}" for i in range(30)]


def test_list_jobs_filters_and_recent_finished(store):
    ids = [j.job_id for j in store.submit([submission(1, "a"), submission(1, "b"), submission(1, "a")])]
    store.cancel_job(ids[0])
    assert [j.id for j in store.list_jobs(tenant="a")] == [ids[0], ids[2]]
    assert [j.id for j in store.list_jobs(finished_limit=0)] == ids[1:]
    assert [j.id for j in store.list_jobs(include_finished=False)] == ids[1:]


def test_tenants_add_reweight_remove(store):
    store.add_tenant("alice", 3)
    with pytest.raises(TenantExists):
        store.add_tenant("alice")
    with pytest.raises(ValueError):
        store.add_tenant("bob", 0)
    store.set_weight("alice", 0.5)
    assert store.list_tenants()[0].weight == 0.5
    with pytest.raises(UnknownTenant):
        store.set_weight("nobody", 2)
    (job,) = store.submit([submission(1, "alice")])
    with pytest.raises(TenantBusy, match="1 unfinished job"):
        store.remove_tenant("alice")
    store.cancel_job(job.job_id)
    store.remove_tenant("alice")
    assert store.list_tenants() == []
    assert store.list_jobs()[0].tenant == "alice"  # history stays
    with pytest.raises(UnknownTenant):
        store.remove_tenant("alice")


def test_finish_request_rejects_non_final_state_and_unknown_id(store):
    store.submit([submission(1)])
    with pytest.raises(ValueError):
        finish(store, "1", RequestState.RUNNING)
    with pytest.raises(StoreError, match="no request"):
        finish(store, "999", RequestState.DONE)


def test_claim_is_fair_across_tenants_and_classes(store):
    store.submit([submission(50, "big"), submission(3, "small"),
                  submission(4, "big", RequestClass.REALTIME)])
    claimed = store.claim("d", per_group=5)
    groups = {}
    for c in claimed:
        groups.setdefault((c.tenant, c.request_class), []).append(c.custom_id)
    assert groups == {
        ("big", RequestClass.BATCH): ["c0", "c1", "c2", "c3", "c4"],
        ("small", RequestClass.BATCH): ["c0", "c1", "c2"],
        ("big", RequestClass.REALTIME): ["c0", "c1", "c2", "c3"],
    }
    # What the daemon holds counts against the group; the limit caps the total.
    more = store.claim("d", per_group=7, held={("big", RequestClass.BATCH): 5}, limit=100)
    assert [c.custom_id for c in more] == ["c5", "c6"]
    assert len(store.claim("d", per_group=100, limit=10)) == 10


def test_flush_release_and_fencing(store):
    from fsched.core.ports.records import TokenUpdate

    (job,) = store.submit([submission(3)])
    a, b, c = store.claim("d1", per_group=10)
    assert store.flush_tokens("d1", [TokenUpdate(a.id, (5, 6), "xy", first_token_at=10.0),
                                     TokenUpdate(b.id, (7,), "z")]) == 2
    assert store.flush_tokens("intruder", [TokenUpdate(c.id, (1,), "no")]) == 0  # not its lease
    assert store.list_jobs(job_id=job.job_id)[0].num_output_tokens == 3
    assert not finish(store, a.id, RequestState.DONE, [5, 6, 9], "xyw", owner="intruder")
    assert store.release("d1", [b.id]) == 1  # back to the queue, tokens kept
    (again,) = store.claim("d2", per_group=10)
    assert again.id == b.id and again.output_tokens == [7]
    assert store.release() == 3  # all running, whoever held them: a dead daemon's leftovers
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.counts.num_running == 0 and summary.counts.num_waiting == 3
    assert summary.num_output_tokens == 3


def test_cancelled_held_and_weights_and_heartbeat(store):
    from fsched.core.ports.records import DaemonStats, DaemonSummary

    (job,) = store.submit([submission(2)])
    store.claim("d1", per_group=1)
    assert store.has_queued()
    store.cancel_job(job.job_id)
    assert len(store.cancelled_held("d1")) == 1 and not store.has_queued()
    store.set_weight("alice", 3)
    assert store.tenant_weights() == {"alice": 3.0}
    beat = DaemonSummary("d1", "host", 1, "cpu", "tiny", 1.0, 2.0, None, DaemonStats(batch=3))
    store.heartbeat(beat)
    store.heartbeat(DaemonSummary("d1", "host", 1, "cpu", "tiny", 1.0, 3.0, None, DaemonStats(batch=4)))
    (row,) = store.list_daemons()
    # The heartbeat is stamped by the database's clock, not the daemon's.
    assert abs(row.heartbeat_at - time.time()) < 5 and 0 <= row.heartbeat_age_s < 5
    assert row.stats == DaemonStats(batch=4)


def test_a_claim_leases_with_an_epoch_and_writes_name_it(store):
    from fsched.core.ports.records import Completion, TokenUpdate

    store.submit([submission(1)])
    (first,) = store.claim("d1", per_group=5, lease_s=30)
    assert first.lease_epoch == 1
    assert store.renew_leases("d1", {first.id: 1}, lease_s=30) == {first.id}
    assert store.renew_leases("d1", {first.id: 0}, lease_s=30) == set()  # a stale epoch holds nothing
    assert store.release("d1") == 1
    (second,) = store.claim("d1", per_group=5, lease_s=30)  # the same daemon, a new lease
    assert second.id == first.id and second.lease_epoch == 2
    # Writes under the old epoch are refused, though the owner is the same.
    assert store.flush_tokens("d1", [TokenUpdate(first.id, (1, 2), "ab", lease_epoch=1)]) == 0
    stale = Completion(first.id, RequestState.DONE, (1,), "a", lease_epoch=1)
    assert store.finish_requests([stale], "d1") == [False]
    assert store.flush_tokens("d1", [TokenUpdate(first.id, (1, 2), "ab", lease_epoch=2)]) == 1
    assert store.finish_requests([Completion(first.id, RequestState.DONE, (1, 2, 3), "abc", lease_epoch=2)],
                                 "d1") == [True]
    (result,) = store.iter_results(first.job_id)
    assert result.output_text == "abc" and result.num_output_tokens == 3


def test_expired_leases_are_reclaimed_and_the_old_holder_is_fenced(store):
    from fsched.core.ports.records import Completion, TokenUpdate

    (job,) = store.submit([submission(3)])
    stale = store.claim("paused", per_group=2, lease_s=0.3)
    live = store.claim("live", per_group=5, lease_s=60)
    assert len(stale) == 2 and len(live) == 1
    assert store.flush_tokens("paused", [TokenUpdate(stale[0].id, (7,), "x", lease_epoch=1)]) == 1
    assert store.reclaim_expired() == 0  # nothing has expired yet
    time.sleep(0.5)
    assert store.reclaim_expired() == 2  # only the expired ones, not the live daemon's
    summary = store.list_jobs(job_id=job.job_id)[0]
    assert summary.counts.num_running == 1 and summary.counts.num_waiting == 2
    taken = {c.id: c for c in store.claim("live", per_group=5, lease_s=60)}
    assert set(taken) == {c.id for c in stale}
    assert taken[stale[0].id].output_tokens == [7] and taken[stale[0].id].lease_epoch == 2  # resumes
    # The paused daemon wakes up: its renewals, flushes and completions change nothing.
    assert store.renew_leases("paused", {c.id: 1 for c in stale}, lease_s=60) == set()
    late_tokens = [TokenUpdate(c.id, (9, 9), "late", lease_epoch=1) for c in stale]
    assert store.flush_tokens("paused", late_tokens) == 0
    late = [Completion(c.id, RequestState.DONE, (9, 9), "late", lease_epoch=1) for c in stale]
    assert store.finish_requests(late, "paused") == [False, False]
    assert store.finish_requests(
        [Completion(c.id, RequestState.DONE, (1,), "ok", lease_epoch=2) for c in stale], "live"
    ) == [True, True]
    done = {r.custom_id: r.output_text for r in store.iter_results(job.job_id)}
    assert {done[c.custom_id] for c in stale} == {"ok"}
    assert store.list_jobs(job_id=job.job_id)[0].counts.num_done == 2


def test_daemons_exchange_decayed_usage_through_the_table(store):
    assert store.exchange_usage("a", {"alice": (2.0, 100.0)}) == []
    peers = store.exchange_usage("b", {"bob": (1.0, 10.0)})
    assert [(p.daemon, p.tenant, p.gpu_s, p.kv_token_s) for p in peers] == [("a", "alice", 2.0, 100.0)]
    assert 0 <= peers[0].age_s < 5
    # A daemon's new figures replace its old ones; it never sees its own.
    store.exchange_usage("a", {"alice": (3.0, 0.0), "bob": (0.5, 0.0)})
    peers = sorted((p.daemon, p.tenant, p.gpu_s) for p in store.exchange_usage("b", {}))
    assert peers == [("a", "alice", 3.0), ("a", "bob", 0.5)]


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


def test_first_submits_of_a_new_tenant_at_once_all_land(db_url):
    import threading

    SqlJobStore(db_url).db.dispose()  # the schema, before the race
    stores = [SqlJobStore(db_url) for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    errors, created = [], []

    def submit(store):
        barrier.wait()
        try:
            created.extend(job.tenant_created for job in store.submit([submission(2, tenant="newbie")]))
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(created) == len(stores)
    assert sum(created) == 1  # one of them created the tenant
    assert stores[0].list_tenants()[0].queued == 2 * len(stores)
    for s in stores:
        s.db.dispose()
