"""Hostile inputs at the front door, in process: the real app over an in-memory table, with a stepped
stand-in daemon. Each refused request answers a 4xx in OpenAI's error shape and leaves the table as it was;
nothing a client sends gets a 5xx or leaves a tenant's objects unreadable.

What needs real sockets and real time (clients that dribble bytes, the metrics listener bound to loopback,
an oversize chunked upload) is in tests/acceptance/test_http_hostile.py.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from fsched.api.expiry import expire_overdue
from tests.support.inprocess import served
from tests.support.seeds import long_seed

pytestmark = pytest.mark.anyio
QUEUE_LIMIT = 40


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def rig():
    async with served() as made:
        made.table.keys.set_limit("max_queued_per_tenant", QUEUE_LIMIT)
        yield made


def http(rig, tenant: str) -> httpx.AsyncClient:
    return rig.server.http(rig.key(tenant))


def openai_error(response: httpx.Response, status: int) -> dict:
    """The body of an error in OpenAI's shape, after checking its status."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str)
    return error


async def upload(c: httpx.AsyncClient, content: bytes) -> str:
    r = await c.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def batch_lines(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "m", "prompt": "p", "max_tokens": 2}}) + "\n"
                   for i in range(n)).encode()


async def raw_json(c: httpx.AsyncClient, path: str, body: str) -> httpx.Response:
    """`body` sent as it is written (json.dumps would escape a lone surrogate in its own way)."""
    return await c.post(path, content=body.encode(), headers={"Content-Type": "application/json"})


async def test_a_lone_surrogate_in_batch_metadata_is_refused_and_the_list_stays_readable(rig):
    async with http(rig, "surrogate-meta") as c:
        file_id = await upload(c, batch_lines(2))
        before = rig.snapshot()
        for meta in ('{"k": "\\ud800"}', '{"\\udfff": "v"}', '{"k": "a\\u0000b"}'):
            body = f'{{"input_file_id": "{file_id}", "endpoint": "/v1/completions", ' \
                   f'"completion_window": "24h", "metadata": {meta}}}'
            error = openai_error(await raw_json(c, "/v1/batches", body), 400)
            assert error["param"] == "metadata", error
        assert rig.snapshot() == before
        listed = await c.get("/v1/batches")
        assert listed.status_code == 200 and listed.json()["data"] == []


async def test_a_lone_surrogate_in_an_id_is_a_clean_error(rig):
    async with http(rig, "surrogate-id") as c:
        before = rig.snapshot()
        body = '{"input_file_id": "file-\\ud800", "endpoint": "/v1/completions", "completion_window": "24h"}'
        error = openai_error(await raw_json(c, "/v1/batches", body), 400)
        assert error["param"] == "input_file_id"
        for path in ("/v1/files/%ED%A0%80", "/v1/batches/%ED%A0%80", "/v1/files/%ED%A0%80/content",
                     "/v1/files/\udcff".encode("utf-8", "surrogateescape").decode("latin-1")):
            assert (await c.get(path)).status_code == 404
        openai_error(await c.get("/v1/batches/batch_%ED%A0%80"), 404)
        openai_error(await c.post("/v1/batches/%ED%A0%80/cancel"), 404)
        openai_error(await c.delete("/v1/files/%ED%A0%80"), 404)
        assert rig.snapshot() == before


@pytest.mark.parametrize("field, value", [("top_p", 1e-300), ("temperature", 1e-45), ("top_p", 5e-324),
                                          ("temperature", 1e-300)])
async def test_tiny_sampling_values_never_crash_the_engine(rig, field, value):
    """A sampling value next to zero is answered as its limit (greedy, or the one likeliest token):
    the same answer as temperature 0, with a co-running request unharmed."""
    async with http(rig, f"tiny-{field}") as c:
        body = {"model": "m", "prompt": "one two three", "max_tokens": 8, "seed": 3, field: value}
        greedy = await c.post("/v1/completions", json={**body, field: 0 if field == "temperature" else 1,
                                                       "temperature": 0})
        assert greedy.status_code == 200, greedy.text
        tiny = await c.post("/v1/completions", json=body)
        assert tiny.status_code == 200, tiny.text
        assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


async def test_a_streamed_request_over_the_context_is_400_before_any_stream(rig):
    async with http(rig, "over-context") as c:
        body = {"model": "m", "prompt": "word " * 9000, "max_tokens": 4}
        plain = openai_error(await c.post("/v1/completions", json=body), 400)
        async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            await r.aread()
            streamed = openai_error(r, 400)
    assert streamed["message"] == plain["message"] and "context" in plain["message"]


async def test_a_batch_larger_than_the_queue_limit_is_400_not_429(rig):
    async with http(rig, "too-big") as c:
        file_id = await upload(c, batch_lines(QUEUE_LIMIT + 1))
        before = rig.snapshot()
        r = await c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                              "completion_window": "24h"})
        error = openai_error(r, 400)
        assert f"larger than your queue limit of {QUEUE_LIMIT}" in error["message"]
        assert "retry-after" not in r.headers
        assert rig.snapshot() == before
        fits = await c.post("/v1/batches", json={"input_file_id": await upload(c, batch_lines(QUEUE_LIMIT)),
                                                 "endpoint": "/v1/completions", "completion_window": "24h"})
        assert fits.status_code == 200, fits.text


async def test_online_ids_are_opaque_and_other_tenants_objects_stay_hidden(rig):
    mine, theirs = http(rig, "ids-a"), http(rig, "ids-b")
    ids = []
    asks = (("/v1/completions", {"prompt": "p", "max_tokens": 1}),
            ("/v1/chat/completions", {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 1}))
    for c in (mine, theirs, mine):
        ids += [(await c.post(path, json={"model": "m", **body})).json()["id"] for path, body in asks]
    async with mine.stream("POST", "/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 2,
                                                           "stream": True}) as r:
        first = [line async for line in r.aiter_lines() if line.startswith("data: {")][0]
    ids.append(json.loads(first[6:])["id"])
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"(cmpl-|chatcmpl-)[0-9a-f]{24}|resp_[0-9a-f]{48}", i) for i in ids), ids
    file_id = await upload(mine, batch_lines(1))
    batch = (await mine.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                  "completion_window": "24h"})).json()["id"]
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch}"):
        assert openai_error(await theirs.get(path), 404)["code"] == "not_found"
    assert openai_error(await theirs.post(f"/v1/batches/{batch}/cancel"), 404)["code"] == "not_found"
    await mine.aclose()
    await theirs.aclose()


async def test_metrics_answer_on_the_metrics_listener_only(rig):
    async with http(rig, "metrics-reader") as c:
        assert openai_error(await c.get("/metrics"), 404)["message"] == "no such endpoint"
    async with rig.server.http() as anonymous:
        openai_error(await anonymous.get("/metrics"), 404)
    async with rig.server.metrics() as scraper:
        scraped = await scraper.get("/metrics")
        assert scraped.status_code == 200 and "fsched:daemons_alive 1.0" in scraped.text
        assert (await scraper.get("/v1/models")).status_code == 404


async def test_the_file_list_pages_as_the_other_lists(rig):
    c = http(rig, "pager")
    made = [await upload(c, batch_lines(1)) for _ in range(5)]
    pages, after = [], None
    while True:
        page = (await c.get("/v1/files", params={"limit": 2, **({"after": after} if after else {})})).json()
        pages.append([f["id"] for f in page["data"]])
        assert page["first_id"] == pages[-1][0] and page["last_id"] == pages[-1][-1]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert [len(p) for p in pages] == [2, 2, 1]
    newest_first = [i for p in pages for i in p]
    assert sorted(newest_first) == sorted(made) and len(set(newest_first)) == 5
    oldest_first = (await c.get("/v1/files", params={"order": "asc"})).json()["data"]
    assert [f["id"] for f in oldest_first] == newest_first[::-1]
    after_third = await c.get("/v1/files", params={"order": "asc", "after": oldest_first[2]["id"]})
    assert after_third.json()["data"] == oldest_first[3:]
    async with http(rig, "pager-other") as other:
        assert (await other.get("/v1/files", params={"after": made[0]})).json()["data"] == []
    for bad in ({"limit": 0}, {"limit": 10_001}, {"order": "sideways"}, {"limit": "x"}):
        openai_error(await c.get("/v1/files", params=bad), 400)
    await c.aclose()


async def test_a_batch_past_its_completion_window_expires_with_its_partial_output(rig):
    c = http(rig, "windowed")
    lines = [{"custom_id": f"short-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "m", "prompt": "p", "max_tokens": 2}} for i in range(3)]
    long = {"model": "m", "prompt": "p", "max_tokens": 2000, "seed": long_seed(2000, prompt="p")}
    lines += [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/completions", "body": long}
              for i in range(2)]
    file_id = await upload(c, "".join(json.dumps(x) + "\n" for x in lines).encode())
    for window in ("25h", "0s", "1d", "soon", "-3h"):
        openai_error(await c.post("/v1/batches", json={"input_file_id": file_id, "completion_window": window,
                                                       "endpoint": "/v1/completions"}), 400)
    made = (await c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                              "completion_window": "2s"})).json()
    assert made["expires_at"] - made["created_at"] in (1, 2)  # whole seconds of times 2 s apart
    for _ in range(200):  # the short ones end, the long ones run on
        rig.daemon.step()
    assert (await c.get(f"/v1/batches/{made['id']}")).json()["status"] == "in_progress"
    # The server's sweep, 3 s later: the window has run out.
    assert expire_overdue(rig.server.state, time.time() + 3) == [made["id"]]
    assert (await c.get(f"/v1/batches/{made['id']}")).json()["status"] == "finalizing"
    rig.daemon.run_until_idle()  # its daemon stops the unfinished ones
    batch = (await c.get(f"/v1/batches/{made['id']}")).json()
    assert batch["status"] == "expired"
    assert batch["expired_at"] >= made["created_at"] + 1 and batch["completed_at"] is None
    assert batch["request_counts"] == {"total": 5, "completed": 3, "failed": 2}

    async def content(file_id: str) -> list[dict]:
        return [json.loads(x) for x in (await c.get(f"/v1/files/{file_id}/content")).text.splitlines()]

    done = await content(batch["output_file_id"])
    assert sorted(x["custom_id"] for x in done) == ["short-0", "short-1", "short-2"]
    unfinished = await content(batch["error_file_id"])
    assert sorted(x["custom_id"] for x in unfinished) == ["long-0", "long-1"]
    assert {x["error"]["code"] for x in unfinished} == {"batch_expired"}
    await c.aclose()


@pytest.mark.parametrize("bias", [{"5": 1, "05": -1}, {"7": 2, "007": 2}, {"0": 1, "00": 1}])
async def test_two_spellings_of_one_token_id_in_logit_bias_are_400(rig, bias):
    """"5" and "05" name one token: refused with the field named, online and in a batch line (the
    batch fails with the line named), and nothing is stored for either."""
    async with http(rig, "bias-alias") as c:
        before = rig.snapshot()
        for path, body in (("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 2}),
                           ("/v1/chat/completions", {"model": "m", "max_tokens": 2,
                                                     "messages": [{"role": "user", "content": "hi"}]})):
            error = openai_error(await c.post(path, json={**body, "logit_bias": bias}), 400)
            assert error["param"] == "logit_bias", error
            assert "token" in error["message"] and "once" in error["message"], error
        assert rig.snapshot() == before
        line = {"custom_id": "c0", "method": "POST", "url": "/v1/completions",
                "body": {"model": "m", "prompt": "p", "max_tokens": 2, "logit_bias": bias}}
        file_id = await upload(c, (json.dumps(line) + "\n").encode())
        r = await c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                              "completion_window": "24h"})
        assert r.status_code == 200, r.text
        batch = r.json()
        assert batch["status"] == "failed", batch
        (error,) = batch["errors"]["data"]
        assert (error["param"], error["line"]) == ("body.logit_bias", 1), error


async def test_a_tenant_creating_too_many_batches_at_once_gets_429(rig):
    """Each creation reads and parses a whole file: a tenant has MAX_CREATIONS_PER_TENANT at once, and
    the next is a 429 saying so (another tenant's are not held up)."""
    from fsched.api.batch import MAX_CREATIONS_PER_TENANT

    busy = rig.server.state.batch_creations
    async with http(rig, "creator") as c, http(rig, "other") as other:
        body = {"input_file_id": await upload(c, batch_lines(2)), "endpoint": "/v1/completions",
                "completion_window": "24h"}
        busy["creator"] = MAX_CREATIONS_PER_TENANT  # as while that many are being created
        before = rig.snapshot()
        r = await c.post("/v1/batches", json=body)
        error = openai_error(r, 429)
        assert error["code"] == "too_many_batch_creations" and r.headers["retry-after"] == "5"
        assert rig.snapshot() == before
        theirs = await other.post("/v1/batches", json={**body, "input_file_id": await upload(other,
                                                                                             batch_lines(2))})
        assert theirs.status_code == 200, theirs.text
        busy["creator"] = MAX_CREATIONS_PER_TENANT - 1
        assert (await c.post("/v1/batches", json=body)).status_code == 200
        assert busy == {"creator": MAX_CREATIONS_PER_TENANT - 1}  # its own place given back
