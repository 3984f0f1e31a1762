"""`fsched serve` as clients see it, in process: the `openai` SDK through an ASGI transport against the real
app over an in-memory job table, with the real daemon loop (the stand-in runner) stepped as the server reads.

Each test has its own table, server and daemon. What needs a real process (sockets, a daemon that stops)
is in tests/acceptance/test_http.py, the tiny model over HTTP in tests/acceptance/test_clients.py.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fsched.api.state import ServerState
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission
from fsched.core.types import RequestClass, RequestStatus
from tests.support.inprocess import served
from tests.support.seeds import long_seed

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hello there"}]
CHAT_URL = "/v1/chat/completions"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def rig():
    async with served() as made:
        yield made


def batch_file(n: int, max_tokens: int = 4, url: str = CHAT_URL) -> bytes:
    lines = []
    for i in range(n):
        body = {"model": "m", "max_tokens": max_tokens, "temperature": 0}
        prompt = {"messages": [{"role": "user", "content": f"q {i}"}]} if "chat" in url else {"prompt": "p"}
        body.update(prompt)
        lines.append(json.dumps({"custom_id": f"id-{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(lines) + "\n").encode()


def classes_of(rig, tenant: str) -> list[str]:
    return [j.request_class.value for j in rig.table.catalog.list_jobs(tenant=tenant)]


async def test_models_and_a_completion(rig):
    c = rig.server.openai(rig.key("models"))
    assert [m.id for m in (await c.models.list()).data] == ["fsched-standin (no model)"]
    done = await c.completions.create(model="any", prompt="one two three", max_tokens=5, temperature=0,
                                      seed=1)
    assert done.object == "text_completion" and done.model == "any"
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].text.split()) == 5
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (3, 5, 8)
    chat = await c.chat.completions.create(model="m", messages=CHAT, max_completion_tokens=3, stop=["never"])
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 3


async def test_streamed_chat_ends_with_the_usage_chunk(rig):
    c = rig.server.openai(rig.key("streamer", "realtime"))
    stream = await c.chat.completions.create(model="m", messages=CHAT, max_tokens=60, stream=True,
                                             stream_options={"include_usage": True}, service_tier="priority",
                                             seed=long_seed(60, messages=CHAT))
    chunks = [chunk async for chunk in stream]
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content) >= 2  # tokens arrive as they are flushed, not all at the end
    assert len(" ".join(content).split()) == 60
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 60
    assert all(ch.usage is None for ch in chunks[:-1])
    assert classes_of(rig, "streamer") == ["realtime"]


async def test_a_full_batch_cycle(rig):
    c = rig.server.openai(rig.key("batcher"))
    uploaded = await c.files.create(file=("in.jsonl", batch_file(20)), purpose="batch")
    assert uploaded.bytes == len(batch_file(20)) and uploaded.purpose == "batch"
    assert (await c.files.content(uploaded.id)).content == batch_file(20)
    batch = await c.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h",
                                   metadata={"run": "nightly"})
    assert batch.status == "in_progress" and batch.metadata == {"run": "nightly"}
    rig.daemon.run_until_idle()
    done = await c.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts.total == 20
    assert (done.request_counts.completed, done.request_counts.failed) == (20, 0)
    lines = [json.loads(x) for x in (await c.files.content(done.output_file_id)).content.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"id-{i}" for i in range(20)]
    assert all(x["response"]["status_code"] == 200 for x in lines)
    assert lines[0]["response"]["body"]["object"] == "chat.completion"
    assert (await c.files.content(done.error_file_id)).content == b""
    assert (await c.files.retrieve(done.output_file_id)).purpose == "batch_output"
    assert done.id in [b.id for b in (await c.batches.list()).data]
    assert classes_of(rig, "batcher") == ["batch"]
    assert (await c.files.delete(uploaded.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await c.files.retrieve(uploaded.id)


async def test_a_bad_line_fails_the_batch_and_nothing_runs(rig):
    c = rig.server.openai(rig.key("careless"))
    data = batch_file(3).replace(b'"temperature": 0', b'"temperature": 9', 1)
    uploaded = await c.files.create(file=("bad.jsonl", data), purpose="batch")
    before = rig.counts()
    batch = await c.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h")
    assert batch.status == "failed" and batch.request_counts.total == 0
    (error,) = batch.errors.data
    assert error.line == 1 and error.param == "body.temperature"
    after = rig.counts()
    assert after["jobs"] == before["jobs"] and after["requests"] == before["requests"]
    wrong_url = await c.files.create(file=("u.jsonl", batch_file(2, url="/v1/completions")), purpose="batch")
    batch = await c.batches.create(input_file_id=wrong_url.id, endpoint=CHAT_URL, completion_window="24h")
    assert batch.status == "failed" and batch.errors.data[0].line == 1


async def test_cancelling_a_batch(rig):
    c = rig.server.openai(rig.key("canceller"))
    uploaded = await c.files.create(file=("big.jsonl", batch_file(200, max_tokens=2000)), purpose="batch")
    batch = await c.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h")
    for _ in range(20):  # some of it runs
        rig.daemon.step()
    cancelling = await c.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"  # running requests stop at the daemon's next sync
    rig.daemon.run_until_idle()
    done = await c.batches.retrieve(batch.id)
    assert done.status == "cancelled" and done.request_counts.completed < 200


async def test_each_error_reaches_the_sdk_as_its_exception(rig):
    key = rig.key("errant", "streaming")
    c = rig.server.openai(key)
    with pytest.raises(openai.BadRequestError) as bad:
        await c.chat.completions.create(model="m", messages=CHAT, temperature=7)
    assert bad.value.body["param"] == "temperature" and bad.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError):
        await rig.server.openai(key[:-1] + ("A" if key[-1] != "A" else "B")).models.list()
    with pytest.raises(openai.AuthenticationError):
        await rig.server.openai("sk-not-ours").models.list()
    with pytest.raises(openai.PermissionDeniedError):
        await c.chat.completions.create(model="m", messages=CHAT, service_tier="priority")
    with pytest.raises(openai.NotFoundError):
        await c.batches.retrieve("batch_nope")
    with pytest.raises(openai.APIStatusError) as too_big:
        await c.completions.create(model="m", prompt="x" * (2 << 20), max_tokens=1)
    assert too_big.value.status_code == 413 and too_big.value.body["type"] == "invalid_request_error"


async def test_the_queue_limit_answers_429_with_retry_after(rig):
    c = rig.server.openai(rig.key("crowd"))
    parsed = parse_job_file(batch_file(200, max_tokens=2000), "long.jsonl")
    rig.table.catalog.submit([JobSubmission(parsed, "crowd", RequestClass.BATCH, 9, "long")])
    rig.table.keys.set_limit("max_queued_per_tenant", 100)  # 200 queued: over it
    with pytest.raises(openai.RateLimitError) as limited:
        await c.completions.create(model="m", prompt="p", max_tokens=1)
    assert limited.value.response.headers["retry-after"] == "1"


async def test_a_revoked_key_is_refused_at_once(rig):
    record, key = rig.table.keys.create_key("leaver", RequestClass.STREAMING)
    c = rig.server.openai(key)
    assert (await c.completions.create(model="m", prompt="p", max_tokens=1)).choices
    rig.table.keys.revoke_key(record.id)
    with pytest.raises(openai.AuthenticationError):
        await c.completions.create(model="m", prompt="p", max_tokens=1)


async def test_a_key_read_once_is_not_read_again_and_once_revoked_none_of_its_requests_is_stored(
        rig, monkeypatch):
    record, key = rig.table.keys.create_key("regular", RequestClass.STREAMING)
    c = rig.server.openai(key)
    assert (await c.completions.create(model="m", prompt="p", max_tokens=1)).choices
    reads = []
    read_key = ServerState.read_key

    async def counted(self, key_id):
        reads.append(key_id)
        return await read_key(self, key_id)

    monkeypatch.setattr(ServerState, "read_key", counted)
    for _ in range(3):
        assert (await c.chat.completions.create(model="m", messages=CHAT, max_tokens=1)).choices
    assert reads == []  # whether it was revoked is read where its row is stored
    jobs = len(rig.table.catalog.list_jobs(tenant="regular"))
    rig.table.keys.revoke_key(record.id)
    with pytest.raises(openai.AuthenticationError):  # a bad body of a revoked key: its 401 first
        await c.chat.completions.create(model="m", messages=CHAT, max_tokens=1, n=300)
    with pytest.raises(openai.AuthenticationError):
        await c.chat.completions.create(model="m", messages=CHAT, max_tokens=1)
    assert len(rig.table.catalog.list_jobs(tenant="regular")) == jobs


async def test_one_tenant_cannot_see_anothers_files_batches_or_requests(rig):
    alice, bob = rig.server.openai(rig.key("alice")), rig.server.openai(rig.key("bob"))
    uploaded = await alice.files.create(file=("a.jsonl", batch_file(2)), purpose="batch")
    batch = await alice.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h")
    for call in (lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(uploaded.id),
                 lambda: bob.files.delete(uploaded.id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL,
                                            completion_window="24h")):
        with pytest.raises(openai.NotFoundError) as missing:
            await call()
        assert "alice" not in str(missing.value.body)
    assert (await bob.files.list()).data == [] and (await bob.batches.list()).data == []
    assert (await alice.batches.retrieve(batch.id)).id == batch.id  # still alice's, untouched


def state_of(rig, tenant: str) -> list[tuple[RequestStatus, int]]:
    return [(p.status, p.num_output_tokens) for job in rig.table.catalog.list_jobs(tenant=tenant)
            for p in rig.table.catalog.request_progress(job.id)]


async def test_a_client_that_disconnects_cancels_its_request(rig):
    key = rig.key("quitter")
    body = {"model": "m", "messages": CHAT, "max_tokens": 2000, "stream": True,
            "seed": long_seed(2000, messages=CHAT)}
    streaming = rig.server.call("POST", CHAT_URL, key, body)
    assert await streaming.status() == 200
    async for chunk in streaming.chunks():
        if b'"content":"w' in chunk:
            break  # the first tokens came; now hang up
    await streaming.hang_up()
    rig.daemon.run_until_idle()  # its daemon stops it at its next sync
    ((state, tokens),) = state_of(rig, "quitter")
    assert state is RequestStatus.FINISHED_CANCELLED and 0 < tokens < 2000
    # A plain (unstreamed) request whose client gives up is cancelled too.
    body = {"model": "m", "prompt": "p", "max_tokens": 2000, "seed": long_seed(2000, prompt="p")}
    plain = rig.server.call("POST", "/v1/completions", key, body)
    for _ in range(10_000):  # until it runs (the server's reads step the daemon)
        if state_of(rig, "quitter")[-1][1] > 0:
            break
        await asyncio.sleep(0)
    await plain.hang_up()
    rig.daemon.run_until_idle()
    assert [state for state, _ in state_of(rig, "quitter")] == [RequestStatus.FINISHED_CANCELLED] * 2


async def test_a_streamed_request_whose_client_leaves_before_its_first_token_is_cancelled(rig):
    """The stream's headers wait for its first news: a client gone meanwhile ends that wait, and its request
    is cancelled before a token is made (the watcher of the client that the stream would have used)."""
    key = rig.key("early")
    body = {"model": "m", "messages": CHAT, "max_tokens": 2000, "stream": True,
            "seed": long_seed(2000, messages=CHAT)}
    streaming = rig.server.call("POST", CHAT_URL, key, body)
    await streaming.hang_up()  # before its head: the handler hears it in its wait for the first news
    assert await streaming.status() == 499
    rig.daemon.run_until_idle()
    ((state, tokens),) = state_of(rig, "early")
    assert state is RequestStatus.FINISHED_CANCELLED and tokens < 2000


async def test_a_stream_opened_before_its_first_news_and_left_then_is_cancelled_cleanly(rig, monkeypatch):
    """A stream whose head went out before its first news (the wait's bound passed) and whose client then
    leaves: the stream, waiting for that news, is cancelled by the request's watcher of its client, and
    so is the request."""
    from fsched.api import online

    monkeypatch.setattr(online, "STREAM_OPEN_WAIT_S", 0.0)
    key = rig.key("opened")
    body = {"model": "m", "messages": CHAT, "max_tokens": 2000, "stream": True,
            "seed": long_seed(2000, messages=CHAT)}
    step = rig.daemon.step
    monkeypatch.setattr(rig.daemon, "step", lambda: False)  # the daemon makes nothing until the client left
    streaming = rig.server.call("POST", CHAT_URL, key, body)
    assert await streaming.status() == 200
    await streaming.hang_up()  # raises whatever the app raised
    monkeypatch.setattr(rig.daemon, "step", step)
    rig.daemon.run_until_idle()
    ((state, tokens),) = state_of(rig, "opened")
    assert state is RequestStatus.FINISHED_CANCELLED and tokens < 2000


async def test_metrics_and_health(rig):
    c = rig.server.openai(rig.key("measured", "realtime"))
    await c.completions.create(model="m", prompt="p", max_tokens=3)
    async with rig.server.metrics() as scraper:
        text = (await scraper.get("/metrics")).text
    for name in ("fsched:time_to_first_token_seconds_bucket{class=\"realtime\"",
                 "fsched:e2e_request_latency_seconds_count{class=\"realtime\"}",
                 "fsched:generation_tokens_total{class=\"realtime\",tenant=\"measured\"} 3.0",
                 "fsched:num_requests_waiting", "fsched:tenant_entitled_share{tenant=\"measured\"}",
                 "fsched:daemons_alive 1.0", "fsched:kv_cache_usage_perc"):
        assert name in text, name
    async with rig.server.http() as client:
        assert (await client.get("/health")).json() == {"status": "ok", "daemons_alive": 1}
        assert (await client.get("/metrics")).status_code == 404  # only on the metrics listener


async def test_no_daemon_is_503_at_once(rig):
    key = rig.key("lonely")
    rig.daemon.stop()  # a stopped daemon says goodbye in the table: no longer alive
    before = rig.counts()
    with pytest.raises(openai.InternalServerError) as unavailable:
        await rig.server.openai(key).completions.create(model="m", prompt="p", max_tokens=1)
    assert unavailable.value.status_code == 503, unavailable.value.body
    assert rig.counts() == before
    async with rig.server.http() as client:
        assert (await client.get("/health")).json() == {"status": "ok", "daemons_alive": 0}


# -- fuzzed bodies -------------------------------------------------------------------------------

_leaf = (st.none() | st.booleans() | st.integers(-3, 3) | st.integers(10**6, 10**20)
         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_fields = st.sampled_from(["model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                           "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "user",
                           "priority", "service_tier", "logprobs", "input_file_id", "endpoint",
                           "completion_window"])
_values = {
    "max_tokens": st.integers(-2, 24) | _json,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bot"]),
                                                "content": st.text(max_size=20) | _json}), max_size=2)
    | _json,
    "prompt": st.text(max_size=30) | _json,
    "service_tier": st.sampled_from(["priority", "default", "flex", "auto", "gold"]) | _json,
}
_random_body = st.dictionaries(_fields, _json, max_size=6).flatmap(
    lambda d: st.fixed_dictionaries({k: _values.get(k, st.just(v)) for k, v in d.items()}))
# Mostly well-formed bodies with one or two fields gone astray, so some are accepted and run.
_near_valid = st.builds(
    lambda base, extra: {**base, **extra},
    st.sampled_from([{"model": "m", "prompt": "a b", "max_tokens": 3},
                     {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}]),
    st.just({}) | st.just({"stream": True}) | _random_body.map(lambda d: dict(list(d.items())[:1])),
)
_body = _random_body | _near_valid
_raw = st.one_of(_body.map(lambda b: json.dumps(b).encode()), st.binary(max_size=64),
                 st.text(max_size=64).map(str.encode))


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/batches", "/v1/files"]),
       raw=_raw)
async def test_fuzzed_bodies_never_500_nor_change_the_table_unless_accepted(rig, path, raw):
    key = rig.key("fuzzer", "streaming")
    before = rig.counts()
    async with rig.server.http(key) as client:
        response = await client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    event(f"HTTP {response.status_code}")
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if error["code"] != "request_failed":  # accepted, then refused by the engine (too long)
            assert rig.counts() == before
