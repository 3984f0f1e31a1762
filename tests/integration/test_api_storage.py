"""The HTTP server's tables (keys, limits, files, batches) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from fsched.core.jobs.apikeys import secret_matches, split_key
from fsched.core.ports.records import UnknownKey
from fsched.core.types import RequestClass
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
