"""The HTTP server's tables (keys, limits, files, batches) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from fsched.core.jobs.apikeys import secret_matches, split_key
from fsched.core.ports.records import UnknownKey
from fsched.core.types import RequestClass, RequestState
from fsched.storage import schema
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.sql_keys import SqlKeyStore


@pytest.fixture
def keys(db_url) -> SqlKeyStore:
    store = SqlKeyStore(db_url)
    yield store
    store.db.dispose()


def test_one_url_opens_every_store_each_by_its_protocol(db_url):
    from fsched.core.ports.catalog import CatalogStore
    from fsched.core.ports.files import FileStore
    from fsched.core.ports.keys import KeyStore
    from fsched.core.ports.queue import QueueStore
    from fsched.core.ports.serving import ServingStore
    from fsched.storage.stores import open_table

    table = open_table(db_url)
    assert table.sqlite == db_url.startswith("sqlite")
    for store, protocol in ((table.catalog, CatalogStore), (table.queue, QueueStore), (table.keys, KeyStore),
                            (table.files, FileStore), (table.serving, ServingStore)):
        assert isinstance(store, protocol), (store, protocol)
    assert table.catalog is table.catalog  # made once
    lock = table.daemon_lock()
    assert (lock is not None) == table.sqlite
    if lock is not None:
        lock.release()
    table.dispose()


def test_keys_are_created_found_listed_and_revoked(keys):
    key, secret = keys.create_key("alice", RequestClass.REALTIME, "laptop")
    key_id, raw = split_key(secret)
    assert key_id == key.id
    found = keys.get_key(key_id)
    assert found == key and secret_matches(raw, found)
    with keys.db.read() as conn:  # the key itself is nowhere in the table
        assert secret not in str(conn.execute(text("SELECT * FROM api_keys")).all())
    keys.create_key("bob", RequestClass.BATCH)
    assert [k.tenant for k in keys.list_keys()] == ["alice", "bob"]
    revoked = keys.revoke_key(key.id)
    assert revoked.revoked and not secret_matches(raw, keys.get_key(key_id))
    assert keys.revoke_key(key.id).revoked_at == revoked.revoked_at  # twice: no error, no change
    with pytest.raises(UnknownKey):
        keys.revoke_key("nope")
    with pytest.raises(ValueError, match="tenant name"):
        keys.create_key("no spaces please", RequestClass.BATCH)


def test_limits_are_stored_and_unset(keys):
    assert keys.stored_limits() == {}
    keys.set_limit("max_queued_per_tenant", 10)
    keys.set_limit("max_queued_per_tenant", 12)
    assert keys.stored_limits() == {"max_queued_per_tenant": 12}
    keys.set_limit("max_queued_per_tenant", None)
    assert keys.stored_limits() == {}


def test_schema_2_databases_gain_the_server_tables(db_url):
    store = SqlJobStore(db_url)
    with store.db.write() as conn:  # back to a version-2 database
        for table in ("batches", "files", "api_keys"):
            conn.execute(text(f"DROP TABLE {table}"))
        conn.execute(text("UPDATE fsched_meta SET value = '2' WHERE key = 'schema_version'"))
    assert schema.ensure_schema(store.db) == 2
    with store.db.read() as conn:
        assert {"api_keys", "files", "batches"} <= set(inspect(conn).get_table_names())
    assert schema.ensure_schema(store.db) == schema.SCHEMA_VERSION
    SqlKeyStore(store.db).create_key("alice", RequestClass.STREAMING)
    store.db.dispose()


def test_files_and_batches_are_seen_only_by_their_tenant(db_url):
    from fsched.core.jobs.batches import BatchRecord, new_batch_id
    from fsched.storage.sql_files import SqlFileStore

    jobs = SqlJobStore(db_url)
    files = SqlFileStore(jobs.db)
    f = files.add_file("alice", "batch", "in.jsonl", b"line\n")
    assert files.get_file("alice", f.id) == f and files.file_content("alice", f.id) == b"line\n"
    assert files.get_file("bob", f.id) is None and files.file_content("bob", f.id) is None
    assert files.list_files("bob") == [] and not files.delete_file("bob", f.id)
    made = []
    for i in range(5):
        record = BatchRecord(new_batch_id(), "alice", None, "/v1/completions", f.id, "24h", {"i": str(i)},
                             1.0 + i)
        files.add_batch(record)
        made.append(record.id)
    assert files.get_batch("bob", made[0]) is None and files.list_batches("bob", None, 10) == []
    newest_first = [b.id for b in files.list_batches("alice", None, 3)]
    assert newest_first == made[::-1][:3]
    assert [b.id for b in files.list_batches("alice", newest_first[-1], 10)] == made[::-1][3:]
    first = files.attach_outputs(files.get_batch("alice", made[0]), (10, 0))
    again = files.attach_outputs(files.get_batch("alice", made[0]), (10, 0))
    assert first.output_file_id == again.output_file_id is not None  # once, whoever asks twice
    assert files.get_file("alice", first.output_file_id).purpose == "batch_output"
    assert len(files.list_files("alice")) == 3
    assert files.delete_file("alice", f.id) and files.get_file("alice", f.id) is None
    jobs.db.dispose()


def _one_job(store: SqlJobStore, tenant: str, n: int, request_class=RequestClass.BATCH):
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission

    lines = "".join(f'{{"prompt": "p{i}", "max_tokens": 4}}\n' for i in range(n))
    parsed = parse_job_file(lines.encode(), "f.jsonl")
    return store.submit([JobSubmission(parsed, tenant, request_class, 5, "f")])[0]


def test_tenant_totals_count_prompt_tokens_and_outcomes_for_chargeback(db_url):
    from fsched.storage.sql_serving import SqlServingStore
    from tests.support.store import finish

    store = SqlJobStore(db_url)
    _one_job(store, "alice", 3)
    _one_job(store, "bob", 1, RequestClass.REALTIME)
    claimed = {c.tenant + str(c.custom_id): c for c in store.claim("d", per_group=5)}
    assert len(claimed) == 4
    a = [c for c in claimed.values() if c.tenant == "alice"]
    finish(store, a[0].id, RequestState.DONE, [1, 2, 3], "abc", "length", prompt_tokens=7)
    finish(store, a[1].id, RequestState.FAILED, error="boom")
    finish(store, a[2].id, RequestState.DONE, [4], "d", "stop", prompt_tokens=5)
    totals = {(t.tenant, t.request_class): t for t in SqlServingStore(store.db).tenant_totals()}
    alice = totals["alice", RequestClass.BATCH]
    assert (alice.generated_tokens, alice.prompt_tokens, alice.done, alice.failed, alice.cancelled) == \
        (4, 12, 2, 1, 0)
    bob = totals["bob", RequestClass.REALTIME]
    assert (bob.generated_tokens, bob.prompt_tokens, bob.done) == (0, 0, 0)
    store.db.dispose()


def test_first_tokens_read_only_the_window(db_url):
    from fsched.core.ports.records import TokenUpdate
    from fsched.storage.sql_serving import SqlServingStore

    store = SqlJobStore(db_url)
    _one_job(store, "alice", 3, RequestClass.STREAMING)
    first, second, third = store.claim("d", per_group=5)
    enqueued = first.enqueued_at
    store.flush_tokens("d", [TokenUpdate(first.id, (1,), "a", first_token_at=enqueued + 0.25),
                             TokenUpdate(second.id, (1,), "a", first_token_at=enqueued + 5.0),
                             TokenUpdate(third.id, (1,), "a", first_token_at=enqueued + 6.0)])
    serving = SqlServingStore(store.db)
    recent = serving.first_tokens(enqueued + 1.0)[RequestClass.STREAMING]
    assert (recent.count, recent.p50_s, recent.p99_s) == (2, pytest.approx(5.5), pytest.approx(5.99))
    assert serving.first_tokens(0.0)[RequestClass.STREAMING].p50_s == pytest.approx(5.0)
    assert serving.first_tokens(enqueued + 10) == {}
    store.db.dispose()


def test_databases_before_origins_gain_prompt_tokens_origins_admin_keys_and_indexes(db_url):
    from fsched.core.types import JobOrigin

    before = next(v for v, step in schema.MIGRATIONS.items() if step is schema._job_origins_and_chargeback)
    store = SqlJobStore(db_url)
    _one_job(store, "alice", 1)
    with store.db.write() as conn:  # an online request's job as the versions before named it
        conn.execute(text("UPDATE jobs SET name = 'http'"))
    with store.db.write() as conn:  # back to a database of that version
        conn.execute(text("DROP INDEX ix_jobs_origin_id"))
        for column in ("num_prompt_tokens", "origin", "key_id"):
            conn.execute(text(f"ALTER TABLE jobs DROP COLUMN {column}"))
        conn.execute(text("ALTER TABLE api_keys DROP COLUMN admin"))
        conn.execute(text("DROP INDEX ix_requests_first_token_at"))
        conn.execute(text(f"UPDATE fsched_meta SET value = '{before}' WHERE key = 'schema_version'"))
    assert schema.ensure_schema(store.db) == before
    with store.db.read() as conn:
        assert "num_prompt_tokens" in {c["name"] for c in inspect(conn).get_columns("jobs")}
        assert "ix_requests_first_token_at" in {i["name"] for i in inspect(conn).get_indexes("requests")}
    key, _ = SqlKeyStore(store.db).create_key("root", RequestClass.BATCH, admin=True)
    assert SqlKeyStore(store.db).get_key(key.id).admin
    (job,) = store.list_jobs()
    assert job.counts.num_requests == 1 and job.origin is JobOrigin.ONLINE  # the data came through
    store.db.dispose()


def test_jobs_carry_their_origin_and_online_requests_are_grouped_per_tenant_and_key(db_url):
    import time

    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission, TokenUpdate
    from fsched.core.types import JobOrigin
    from tests.support.store import finish

    store = SqlJobStore(db_url)
    file_job = _one_job(store, "alice", 2)
    one = parse_job_file(b'{"prompt": "hi", "max_tokens": 4}\n', "<http>")
    online = [store.submit([JobSubmission(one, tenant, RequestClass.REALTIME, 5, "http", JobOrigin.ONLINE,
                                          key)])[0] for tenant, key in
              (("alice", "k1"), ("alice", "k1"), ("alice", "k2"), ("bob", "k3"))]
    store.submit([JobSubmission(one, "bob", RequestClass.STREAMING, 5, "generate", JobOrigin.GENERATE)])
    assert [j.id for j in store.list_jobs(interactive=False)] == [file_job.job_id]
    assert len(store.list_jobs(interactive=True)) == 5
    assert {j.origin for j in store.list_jobs()} == {JobOrigin.SUBMIT, JobOrigin.ONLINE, JobOrigin.GENERATE}
    claimed = {c.job_id: c for c in store.claim("d", per_group=10)}
    first = claimed[online[0].job_id]
    store.flush_tokens("d", [TokenUpdate(first.id, (1,), "x", first_token_at=time.time())])
    finish(store, first.id, RequestState.DONE, [1, 2], "xy", "length", prompt_tokens=1)
    groups = {(g.tenant, g.key_id): g for g in store.online_groups()}
    assert set(groups) == {("alice", "k1"), ("alice", "k2"), ("bob", "k3"), ("bob", None)}
    k1 = groups["alice", "k1"]
    assert (k1.requests, k1.in_flight, k1.done, k1.generated_tokens, k1.recent) == (2, 1, 1, 2, 1)
    assert k1.ttft_p50_s is not None and 0 <= k1.ttft_p50_s < 60
    assert groups["alice", "k2"].ttft_p50_s is None
    assert [g.key_id for g in store.online_groups(tenant="bob")] == [None, "k3"]
    store.db.dispose()
