"""The HTTP server's tables (keys, limits, files, batches) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from fsched.core.jobs.apikeys import secret_matches, split_key
from fsched.core.types import RequestClass
from fsched.storage import schema
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.keys import SqlKeyStore, UnknownKey


@pytest.fixture
def keys(db_url) -> SqlKeyStore:
    store = SqlKeyStore(db_url)
    yield store
    store.db.dispose()


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
