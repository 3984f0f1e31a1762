"""The KeyStore contract, one set of tests run on every implementation: in memory, SQLite, PostgreSQL.

API keys (made once, stored as a hash, revoked at once), the limits an
admin stores, and per-key rate limits counted for every server process.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from fsched.core.jobs.apikeys import secret_matches, split_key
from fsched.core.ports.keys import KeyStore
from fsched.core.ports.records import UnknownKey
from fsched.core.types import RequestClass
from fsched.storage import sql_limits
from tests.support.tables import KINDS, open_table


@pytest.fixture(params=KINDS)
def table(request):
    made = open_table(request, request.param)
    yield made
    made.close()


def test_it_is_a_key_store(table):
    assert isinstance(table.keys, KeyStore)


def test_keys_are_created_found_listed_and_revoked(table):
    keys = table.keys
    key, secret = keys.create_key("alice", RequestClass.REALTIME, "laptop")
    key_id, raw = split_key(secret)
    assert key_id == key.id
    found = keys.get_key(key_id)
    assert found == key and secret_matches(raw, found)
    assert secret not in table.stored_text() and raw not in table.stored_text()  # the key is nowhere
    keys.create_key("bob", RequestClass.BATCH)
    assert [k.tenant for k in keys.list_keys()] == ["alice", "bob"]
    revoked = keys.revoke_key(key.id)
    assert revoked.revoked and not secret_matches(raw, keys.get_key(key_id))
    assert keys.revoke_key(key.id).revoked_at == revoked.revoked_at  # twice: no error, no change
    with pytest.raises(UnknownKey):
        keys.revoke_key("nope")
    with pytest.raises(ValueError, match="tenant name"):
        keys.create_key("no spaces please", RequestClass.BATCH)
    admin, _ = keys.create_key("root", RequestClass.BATCH, admin=True)
    assert keys.get_key(admin.id).admin and not keys.get_key(key.id).admin


def test_limits_are_stored_and_unset(table):
    keys = table.keys
    assert keys.stored_limits() == {}
    keys.set_limit("max_queued_per_tenant", 10)
    keys.set_limit("max_queued_per_tenant", 12)
    assert keys.stored_limits() == {"max_queued_per_tenant": 12}
    keys.set_limit("max_queued_per_tenant", None)
    assert keys.stored_limits() == {}


def test_the_store_counts_for_every_replica_at_the_limit_and_one_past(table):
    kid, _ = table.keys.create_key("alice", RequestClass.STREAMING)
    other, _ = table.keys.create_key("bob", RequestClass.STREAMING)
    kid, other = kid.id, other.id
    replica = table.another()  # a second server process's stores over the same table
    limits = {"requests_per_minute": 4}
    try:
        answers = [t.keys.take_rate(kid, limits, {"requests": 1}) for t in (table, replica) * 2]
        assert all(d.allowed for d in answers)
        fifth = replica.keys.take_rate(kid, limits, {"requests": 1})
        assert not fifth.allowed and fifth.refused_by == "requests_per_minute"
        assert 10 < fifth.retry_after_s <= 15
        assert table.keys.take_rate(other, limits, {"requests": 1}).allowed  # another key: its own count
    finally:
        replica.close()
    table.keys.set_limit("tokens_per_minute", 100)
    table.keys.set_key_limit(kid, "requests_per_minute", 9)
    assert table.keys.rate_limits(kid) == {"requests_per_minute": 9, "tokens_per_minute": 100}
    assert table.keys.rate_limits(other) == {"tokens_per_minute": 100}
    table.keys.set_limit("max_queued_per_tenant", 12)  # a stored limit that is no rate limit
    read = table.keys.stored_and_rate_limits([kid, other, "nokey"])
    assert read.rate_limits == {
        kid: {"requests_per_minute": 9, "tokens_per_minute": 100}, other: {"tokens_per_minute": 100},
        "nokey": {"tokens_per_minute": 100}}
    assert read.stored == table.keys.stored_limits() == {"tokens_per_minute": 100,
                                                        "max_queued_per_tenant": 12}
    table.keys.set_key_limit(kid, "requests_per_minute", None)
    assert table.keys.key_limits(kid) == {}
    with pytest.raises(UnknownKey):
        table.keys.set_key_limit("nokey", "requests_per_minute", 1)


def test_the_rate_limits_of_many_keys_are_read_in_pieces_and_match_each_keys_own(table, monkeypatch):
    monkeypatch.setattr(sql_limits, "IDS_A_STATEMENT", 2)  # five keys: three IN lists on SQL tables
    ids = [table.keys.create_key("alice", RequestClass.STREAMING)[0].id for _ in range(5)]
    for n, kid in enumerate(ids[::2]):
        table.keys.set_key_limit(kid, "requests_per_minute", n + 1)
    table.keys.set_limit("tokens_per_minute", 50)
    read = table.keys.stored_and_rate_limits(ids)
    assert read.rate_limits == {kid: table.keys.rate_limits(kid) for kid in ids}
    assert read.rate_limits[ids[4]] == {"requests_per_minute": 3, "tokens_per_minute": 50}
    assert read.stored == {"tokens_per_minute": 50}
    none = table.keys.stored_and_rate_limits([])  # no key: the stored limits alone
    assert none.rate_limits == {} and none.stored == {"tokens_per_minute": 50}


def test_a_sql_table_reads_the_stored_limits_and_a_few_keys_rate_limits_in_one_statement(table, monkeypatch):
    if table.kind == "memory":
        pytest.skip("statements are a SQL table's")
    ids = [table.keys.create_key("alice", RequestClass.STREAMING)[0].id for _ in range(3)]
    table.keys.set_key_limit(ids[0], "requests_per_minute", 4)
    table.keys.set_limit("tokens_per_minute", 50)
    statements, rows = [], table.db.rows
    monkeypatch.setattr(table.db, "rows", lambda *args: statements.append(args) or rows(*args))
    read = table.keys.stored_and_rate_limits(ids)
    assert read.rate_limits[ids[0]] == {"requests_per_minute": 4, "tokens_per_minute": 50}
    assert table.keys.rate_limits(ids[1]) == {"tokens_per_minute": 50}
    assert len(statements) == 2  # one each
    table.keys.stored_and_rate_limits([])
    assert len(statements) == 3


def test_replicas_racing_on_a_new_key_let_exactly_the_limit_through(table):
    record, _ = table.keys.create_key("alice", RequestClass.STREAMING)
    replicas = [table.another() for _ in range(4)]
    try:
        def attempt(i: int) -> bool:
            return replicas[i % 4].keys.take_rate(record.id, {"requests_per_minute": 20},
                                                  {"requests": 1}).allowed

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(attempt, range(40)))
    finally:
        for replica in replicas:
            replica.close()
    assert outcomes.count(True) == 20


def test_a_request_past_a_limit_is_refused_and_changes_nothing(table):
    record, _ = table.keys.create_key("alice", RequestClass.STREAMING)
    limits = {"requests_per_minute": 60, "tokens_per_minute": 10}
    assert table.keys.take_rate(record.id, limits, {"requests": 1, "tokens": 8}).allowed
    refused = table.keys.take_rate(record.id, limits, {"requests": 1, "tokens": 8})
    assert not refused.allowed and refused.refused_by == "tokens_per_minute" and refused.tats == {}
    # The refusal spent nothing: a request within what is left still passes.
    assert table.keys.take_rate(record.id, limits, {"requests": 1, "tokens": 2}).allowed
    assert table.keys.take_rate(record.id, {}, {"requests": 1}).allowed  # no limit: no count
