"""The SQL job table as the HTTP server opens it: every store by one URL, and the migrations of the
server's tables (what the stores do is in the contract suites, test_*_contract.py)."""

from __future__ import annotations

from sqlalchemy import inspect, text

from fsched.core.types import RequestClass
from fsched.storage import schema
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.sql_keys import SqlKeyStore


def test_one_url_opens_every_store_each_by_its_protocol(db_url):
    from fsched.core.ports.catalog import CatalogStore
    from fsched.core.ports.files import FileStore
    from fsched.core.ports.keys import KeyStore
    from fsched.core.ports.queue import QueueStore
    from fsched.core.ports.serving import ServingStore
    from fsched.core.ports.table import Table
    from fsched.storage.stores import open_table

    table = open_table(db_url)
    assert isinstance(table, Table) and table.sqlite == db_url.startswith("sqlite")
    for store, protocol in ((table.catalog, CatalogStore), (table.queue, QueueStore), (table.keys, KeyStore),
                            (table.files, FileStore), (table.serving, ServingStore)):
        assert isinstance(store, protocol), (store, protocol)
    assert table.catalog is table.catalog  # made once
    lock = table.daemon_lock()
    assert (lock is not None) == table.sqlite
    if lock is not None:
        lock.release()
    table.dispose()


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


def _one_job(store: SqlJobStore, tenant: str, n: int, request_class=RequestClass.BATCH):
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission

    lines = "".join(f'{{"prompt": "p{i}", "max_tokens": 4}}\n' for i in range(n))
    parsed = parse_job_file(lines.encode(), "f.jsonl")
    return store.submit([JobSubmission(parsed, tenant, request_class, 5, "f")])[0]


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


def test_databases_before_batch_storage_charge_their_batches_what_their_output_files_hold(db_url):
    from fsched.core.jobs.batches import BatchRecord, new_batch_id
    from fsched.storage.sql_files import SqlFileStore

    store = SqlJobStore(db_url)
    files = SqlFileStore(store.db)
    job = _one_job(store, "alice", 2)
    record = BatchRecord(new_batch_id(), "alice", job.job_id, "/v1/completions", "file-x", "24h", None, 1.0)
    files.add_batch(record)
    files.attach_outputs(record, (300, 45))
    before = next(v for v, step in schema.MIGRATIONS.items() if step is schema._add_batch_storage)
    with store.db.write() as conn:  # back to a database of that version
        for column in ("stored_bytes", "reclaimed_at"):
            schema.drop_column(conn, "batches", column)
        conn.execute(text(f"UPDATE fsched_meta SET value = '{before}' WHERE key = 'schema_version'"))
    assert schema.ensure_schema(store.db) == before
    assert files.get_batch("alice", record.id).stored_bytes == 345 and files.stored_bytes("alice") == 345
    assert files.get_batch("alice", record.id).reclaimed_at is None
    store.db.dispose()
