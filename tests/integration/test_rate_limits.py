"""Per-key rate limits and the file quota through the HTTP API, over a real table (SQLite and
PostgreSQL): at the limit, one past it (429, Retry-After, OpenAI's shape), other tenants unaffected,
and the count shared by replicas."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fsched.api import ratelimit
from fsched.api.app import create_app
from fsched.api.state import Backend
from fsched.core.ports.records import UnknownKey
from fsched.core.types import RequestClass
from fsched.storage.stores import JobTable
from tests.support.thread_daemon import answering

BODY = {"model": "m", "prompt": "hi", "max_tokens": 4}


@pytest.fixture
def table(db_url):
    t = JobTable(db_url)
    yield t
    t.dispose()
    ratelimit._LIMITS.clear()


def client_of(table: JobTable) -> TestClient:
    backend = Backend(jobs=table.catalog, keys=table.keys, files=table.files, serving=table.serving)
    return TestClient(create_app(backend))


def new_key(table: JobTable, tenant: str) -> tuple[str, dict]:
    record, key = table.keys.create_key(tenant, RequestClass.STREAMING)
    return record.id, {"Authorization": f"Bearer {key}"}


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    return error


def test_the_store_counts_for_every_replica_at_the_limit_and_one_past(table, db_url):
    kid, _ = new_key(table, "alice")
    other, _ = new_key(table, "bob")
    replica = JobTable(db_url)  # a second server process's stores over the same table
    limits = {"requests_per_minute": 4}
    try:
        answers = [store.keys.take_rate(kid, limits, {"requests": 1}) for store in (table, replica) * 2]
        assert all(d.allowed for d in answers)
        fifth = replica.keys.take_rate(kid, limits, {"requests": 1})
        assert not fifth.allowed and fifth.refused_by == "requests_per_minute"
        assert 10 < fifth.retry_after_s <= 15
        assert table.keys.take_rate(other, limits, {"requests": 1}).allowed  # another key: its own count
    finally:
        replica.dispose()
    table.keys.set_limit("tokens_per_minute", 100)
    table.keys.set_key_limit(kid, "requests_per_minute", 9)
    assert table.keys.rate_limits(kid) == {"requests_per_minute": 9, "tokens_per_minute": 100}
    assert table.keys.rate_limits(other) == {"tokens_per_minute": 100}
    table.keys.set_key_limit(kid, "requests_per_minute", None)
    assert table.keys.key_limits(kid) == {}
    with pytest.raises(UnknownKey):
        table.keys.set_key_limit("nokey", "requests_per_minute", 1)


def test_replicas_racing_on_a_new_key_let_exactly_the_limit_through(table, db_url):
    from concurrent.futures import ThreadPoolExecutor

    kid, _ = new_key(table, "alice")
    replicas = [JobTable(db_url) for _ in range(4)]
    try:
        def attempt(i: int) -> bool:
            return replicas[i % 4].keys.take_rate(kid, {"requests_per_minute": 20}, {"requests": 1}).allowed

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(attempt, range(40)))
    finally:
        for replica in replicas:
            replica.dispose()
    assert outcomes.count(True) == 20


def test_requests_past_a_keys_limit_get_429_with_retry_after_and_others_go_on(table):
    kid, alice = new_key(table, "alice")
    _, bob = new_key(table, "bob")
    table.keys.set_key_limit(kid, "requests_per_minute", 2)
    with answering(table.queue), client_of(table) as client:
        for _ in range(2):
            assert client.post("/v1/completions", json=BODY, headers=alice).status_code == 200
        third = client.post("/v1/completions", json=BODY, headers=alice)
        error = refused(third, 429, "rate_limit_exceeded")
        assert error["type"] == "rate_limit_error" and "2 requests per minute" in error["message"]
        assert int(third.headers["Retry-After"]) == 30
        streamed = client.post("/v1/chat/completions", headers=alice, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        refused(streamed, 429, "rate_limit_exceeded")  # streamed too: refused before a stream opens
        for _ in range(3):  # bob has no limit of his own and none table-wide
            assert client.post("/v1/completions", json=BODY, headers=bob).status_code == 200
    before = table.catalog.list_jobs()
    assert sum(1 for j in before if j.tenant == "alice") == 2  # the refused ones stored nothing


def test_tokens_past_the_table_wide_limit_are_refused_and_a_request_that_never_fits_is_a_400(table):
    table.keys.set_limit("tokens_per_minute", 10)
    _, alice = new_key(table, "alice")
    _, bob = new_key(table, "bob")
    with answering(table.queue), client_of(table) as client:
        for max_tokens in (6, 4):
            assert client.post("/v1/completions", json={**BODY, "max_tokens": max_tokens},
                               headers=alice).status_code == 200
        past = client.post("/v1/completions", json={**BODY, "max_tokens": 1}, headers=alice)
        refused(past, 429, "rate_limit_exceeded")
        assert int(past.headers["Retry-After"]) == 6  # one token at 10 a minute
        assert client.post("/v1/completions", json={**BODY, "max_tokens": 10}, headers=bob).status_code == 200
        never = client.post("/v1/completions", json={**BODY, "max_tokens": 11, "n": 1}, headers=bob)
        assert refused(never, 400, "rate_limit_exceeded")["param"] == "max_tokens"
        two_choices = client.post("/v1/completions", json={**BODY, "max_tokens": 6, "n": 2}, headers=bob)
        refused(two_choices, 400, "rate_limit_exceeded")  # 12 tokens: every choice counts


def upload(client: TestClient, auth: dict, content: bytes):
    return client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                       files={"file": ("in.jsonl", content)})


def test_uploads_past_the_tenants_file_quota_get_a_4xx_naming_it_and_store_nothing(table):
    table.keys.set_limit("max_file_bytes_per_tenant", 1000)
    _, alice = new_key(table, "alice")
    _, bob = new_key(table, "bob")
    with client_of(table) as client:
        first = upload(client, alice, b"x" * 600)
        assert first.status_code == 200, first.text
        assert upload(client, alice, b"y" * 400).status_code == 200  # at the quota
        past = upload(client, alice, b"z")
        error = refused(past, 400, "file_quota_exceeded")
        assert "quota of 1,000 bytes" in error["message"] and "max_file_bytes_per_tenant" in error["message"]
        assert len(client.get("/v1/files", headers=alice).json()["data"]) == 2
        assert upload(client, bob, b"b" * 1000).status_code == 200  # bob's bytes are his own
        assert client.delete(f"/v1/files/{first.json()['id']}", headers=alice).status_code == 200
        again = upload(client, alice, b"w" * 600)
        assert again.status_code == 200
        content = client.get(f"/v1/files/{again.json()['id']}/content", headers=alice)
        assert content.content == b"w" * 600
