"""Per-key rate limits and the file quota through the HTTP API, in process over an in-memory table: at the
limit, one past it (429 with Retry-After, or 400 for what can never pass, in OpenAI's shape), other
tenants unaffected. How the stores count for every replica is in the keys and files contract suites."""

from __future__ import annotations

import pytest

from tests.support.inprocess import served

pytestmark = pytest.mark.anyio
BODY = {"model": "m", "prompt": "hi", "max_tokens": 4}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def rig():
    async with served() as made:
        yield made


def new_key(rig, tenant: str) -> tuple[str, dict]:
    from fsched.core.types import RequestClass

    record, key = rig.table.keys.create_key(tenant, RequestClass.STREAMING)
    return record.id, {"Authorization": f"Bearer {key}"}


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    return error


async def test_requests_past_a_keys_limit_get_429_with_retry_after_and_others_go_on(rig):
    kid, alice = new_key(rig, "alice")
    _, bob = new_key(rig, "bob")
    rig.table.keys.set_key_limit(kid, "requests_per_minute", 2)
    async with rig.server.http() as client:
        for _ in range(2):
            assert (await client.post("/v1/completions", json=BODY, headers=alice)).status_code == 200
        third = await client.post("/v1/completions", json=BODY, headers=alice)
        error = refused(third, 429, "rate_limit_exceeded")
        assert error["type"] == "rate_limit_error" and "2 requests per minute" in error["message"]
        assert int(third.headers["Retry-After"]) == 30
        streamed = await client.post("/v1/chat/completions", headers=alice, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        refused(streamed, 429, "rate_limit_exceeded")  # streamed too: refused before a stream opens
        for _ in range(3):  # bob has no limit of his own and none table-wide
            assert (await client.post("/v1/completions", json=BODY, headers=bob)).status_code == 200
    before = rig.table.catalog.list_jobs()
    assert sum(1 for j in before if j.tenant == "alice") == 2  # the refused ones stored nothing


async def test_tokens_past_the_table_wide_limit_are_refused_and_a_request_that_never_fits_is_a_400(rig):
    rig.table.keys.set_limit("tokens_per_minute", 10)
    _, alice = new_key(rig, "alice")
    _, bob = new_key(rig, "bob")
    async with rig.server.http() as client:
        for max_tokens in (6, 4):
            assert (await client.post("/v1/completions", json={**BODY, "max_tokens": max_tokens},
                                      headers=alice)).status_code == 200
        past = await client.post("/v1/completions", json={**BODY, "max_tokens": 1}, headers=alice)
        refused(past, 429, "rate_limit_exceeded")
        assert int(past.headers["Retry-After"]) == 6  # one token at 10 a minute
        assert (await client.post("/v1/completions", json={**BODY, "max_tokens": 10},
                                  headers=bob)).status_code == 200
        never = await client.post("/v1/completions", json={**BODY, "max_tokens": 11, "n": 1}, headers=bob)
        assert refused(never, 400, "rate_limit_exceeded")["param"] == "max_tokens"
        two_choices = await client.post("/v1/completions", json={**BODY, "max_tokens": 6, "n": 2},
                                        headers=bob)
        refused(two_choices, 400, "rate_limit_exceeded")  # 12 tokens: every choice counts


async def test_logprobs_are_charged_as_the_table_wide_setting_says(rig):
    """n=2 x 10 tokens with top_logprobs 19 may make 2 x 10 x 20 logprob records: at the default of 20
    records a token, 20 tokens more than without; an admin's setting changes the rate."""
    rig.table.keys.set_limit("tokens_per_minute", 30)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "n": 2}
    asked = {**chat, "logprobs": True, "top_logprobs": 19}
    _, alice = new_key(rig, "alice")
    _, bob = new_key(rig, "bob")
    async with rig.server.http() as client:
        never = await client.post("/v1/chat/completions", json=asked, headers=alice)  # 40 > 30
        assert "logprobs counted" in refused(never, 400, "rate_limit_exceeded")["message"]
        assert (await client.post("/v1/chat/completions", json=chat, headers=alice)).status_code == 200
        rig.table.keys.set_limit("logprobs_per_charged_token", 200)  # 2 tokens more: 22
        rig.server.state._limits.at = -1e18  # read again now, not within the cache's TTL
        assert (await client.post("/v1/chat/completions", json=asked, headers=bob)).status_code == 200
        past = await client.post("/v1/chat/completions", json=chat, headers=bob)  # 22 + 20 > 30
        refused(past, 429, "rate_limit_exceeded")


async def upload(client, auth: dict, content: bytes):
    return await client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                             files={"file": ("in.jsonl", content)})


async def test_uploads_past_the_tenants_file_quota_get_a_4xx_naming_it_and_store_nothing(rig):
    rig.table.keys.set_limit("max_file_bytes_per_tenant", 1000)
    _, alice = new_key(rig, "alice")
    _, bob = new_key(rig, "bob")
    async with rig.server.http() as client:
        first = await upload(client, alice, b"x" * 600)
        assert first.status_code == 200, first.text
        assert (await upload(client, alice, b"y" * 400)).status_code == 200  # at the quota
        past = await upload(client, alice, b"z")
        error = refused(past, 400, "file_quota_exceeded")
        assert "quota of 1,000 bytes" in error["message"] and "max_file_bytes_per_tenant" in error["message"]
        assert len((await client.get("/v1/files", headers=alice)).json()["data"]) == 2
        assert (await upload(client, bob, b"b" * 1000)).status_code == 200  # bob's bytes are his own
        assert (await client.delete(f"/v1/files/{first.json()['id']}", headers=alice)).status_code == 200
        again = await upload(client, alice, b"w" * 600)
        assert again.status_code == 200
        content = await client.get(f"/v1/files/{again.json()['id']}/content", headers=alice)
        assert content.content == b"w" * 600


def batch_file(n: int) -> bytes:
    import json

    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "m", "prompt": "p" * 50, "max_tokens": 2}}) + "\n"
                   for i in range(n)).encode()


async def test_a_batch_past_the_quota_is_a_400_naming_it_and_by_how_much(rig):
    from fsched.core.jobs.batches import ROW_OVERHEAD_BYTES

    content = batch_file(10)
    rig.table.keys.set_limit("max_file_bytes_per_tenant", len(content) + 10 * ROW_OVERHEAD_BYTES)
    _, alice = new_key(rig, "alice")
    async with rig.server.http() as client:
        file_id = (await upload(client, alice, content)).json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        past = await client.post("/v1/batches", json=body, headers=alice)
        error = refused(past, 400, "file_quota_exceeded")
        assert error["param"] == "input_file_id" and "max_file_bytes_per_tenant" in error["message"]
        charge = 10 * (ROW_OVERHEAD_BYTES + len("r0") + 50)
        assert f"would store {charge:,} bytes more" in error["message"]
        assert f"{charge - 10 * ROW_OVERHEAD_BYTES:,} past its quota" in error["message"]
    assert rig.table.rows.jobs == {} and rig.table.rows.batches == {}  # nothing stored


async def test_a_reclaimed_batch_answers_with_its_counts_and_its_output_file_is_gone(rig):
    from fsched.api.expiry import reclaim_ended

    _, alice = new_key(rig, "alice")
    async with rig.server.http() as client:
        file_id = (await upload(client, alice, batch_file(3))).json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        seen, unseen = [(await client.post("/v1/batches", json=body, headers=alice)).json()["id"]
                        for _ in range(2)]
        rig.daemon.run_until_idle()
        batch = (await client.get(f"/v1/batches/{seen}", headers=alice)).json()  # its output files made
        output = batch["output_file_id"]
        assert (await client.get(f"/v1/files/{output}/content", headers=alice)).status_code == 200
        retention = (await rig.server.state.limits()).batch_retention_s
        assert retention == 30 * 24 * 3600
        now = rig.clock()
        assert reclaim_ended(rig.server.state, now + retention - 60, retention) == []  # not yet
        reclaimed = reclaim_ended(rig.server.state, now + retention + 1, retention)
        assert sorted(reclaimed) == sorted([seen, unseen])
        assert rig.table.rows.requests == {}
        for batch_id in (seen, unseen):
            after = (await client.get(f"/v1/batches/{batch_id}", headers=alice)).json()
            assert after["status"] == "completed"
            assert after["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert after["output_file_id"] is None  # reclaimed before its output files were made: none
        gone = await client.get(f"/v1/files/{output}/content", headers=alice)
        error = refused(gone, 410, "file_reclaimed")
        assert seen in error["message"] and "batch_retention_s" in error["message"]
        assert (await client.get(f"/v1/files/{output}", headers=alice)).status_code == 200  # its record


async def test_a_batch_that_loses_the_room_to_another_meanwhile_is_refused_and_its_rows_discarded(
        rig, monkeypatch):
    """The first check passed (as if another creation had not yet stored its batch); the check with the
    batch made visible refuses it: its job is cancelled and its rows deleted, and no batch is listed."""
    from fsched.core.jobs.batches import ROW_OVERHEAD_BYTES

    content = batch_file(10)
    charge = 10 * (ROW_OVERHEAD_BYTES + len("r0") + 50)
    rig.table.keys.set_limit("max_file_bytes_per_tenant", charge + 100)  # the batch fits, not with the upload
    _, alice = new_key(rig, "alice")
    async with rig.server.http() as client:
        file_id = (await upload(client, alice, content)).json()["id"]
        monkeypatch.setattr(type(rig.table.files), "stored_bytes", lambda self, tenant: 0)
        body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        late = await client.post("/v1/batches", json=body, headers=alice)
        assert "past its quota" in refused(late, 400, "file_quota_exceeded")["message"]
        assert (await client.get("/v1/batches", headers=alice)).json()["data"] == []
    (job,) = rig.table.rows.jobs.values()
    assert job.state.value == "cancelled" and rig.table.rows.requests == {}
