"""`fsched serve` as clients see it: the real `openai` SDK against a server and a daemon in subprocesses.

One server and one stand-in daemon (1 ms a step) serve the whole module; each
test makes its own keys, so its tenants are its own.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fsched.core.runners.standin import STANDIN_EOS, standin_encode, standin_token

from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    s = make_server(tmp_path_factory.mktemp("http"))
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    s.start_daemon("--model", "standin:1ms")
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()


def client(server: Server, key: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, timeout=60, **kw)


CHAT = [{"role": "user", "content": "hello there"}]
CHAT_URL = "/v1/chat/completions"


def long_seed(n: int, messages=None, prompt=None) -> int:
    """A seed with which the stand-in generates `n` tokens without drawing its end token
    (about one draw in 500 is), so a test's request runs as long as it needs."""
    for seed in range(100_000):
        if runs_long(n, seed, messages, prompt):
            return seed
    raise AssertionError("no such seed")


def runs_long(n: int, seed: int | None, messages=None, prompt=None) -> bool:
    """Whether the stand-in generates `n` tokens with this seed and input without drawing its end token."""
    context = standin_encode(prompt, messages)
    for _ in range(n):
        token = standin_token(seed, context)
        if token == STANDIN_EOS:
            return False
        context.append(token)
    return True


def test_models_and_a_completion(server):
    c = client(server, server.key("models"))
    assert [m.id for m in c.models.list().data] == ["fsched-standin (no model)"]
    done = c.completions.create(model="any", prompt="one two three", max_tokens=5, temperature=0, seed=1)
    assert done.object == "text_completion" and done.model == "any"
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].text.split()) == 5
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (3, 5, 8)
    chat = c.chat.completions.create(model="m", messages=CHAT, max_completion_tokens=3, stop=["never"])
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 3


def test_streamed_chat_ends_with_the_usage_chunk(server):
    c = client(server, server.key("streamer", "realtime"))
    chunks = list(c.chat.completions.create(model="m", messages=CHAT, max_tokens=60, stream=True,
                                            stream_options={"include_usage": True}, service_tier="priority",
                                            seed=long_seed(60, messages=CHAT)))
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content) >= 2  # tokens arrive as they are flushed, not all at the end
    assert len(" ".join(content).split()) == 60
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 60
    assert all(ch.usage is None for ch in chunks[:-1])
    rows = server.rows("SELECT class FROM jobs WHERE tenant = 'streamer'")
    assert rows == [("realtime",)]


def batch_file(n: int, max_tokens: int = 4, url: str = "/v1/chat/completions") -> bytes:
    lines = []
    for i in range(n):
        body = {"model": "m", "max_tokens": max_tokens, "temperature": 0}
        prompt = {"messages": [{"role": "user", "content": f"q {i}"}]} if "chat" in url else {"prompt": "p"}
        body.update(prompt)
        lines.append(json.dumps({"custom_id": f"id-{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(lines) + "\n").encode()


def wait_batch(c: openai.OpenAI, batch_id: str, until=("completed", "failed", "cancelled"), timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = c.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        time.sleep(0.1)
    raise TimeoutError(f"batch {batch_id} is still {batch.status}")


def test_a_full_batch_cycle(server):
    c = client(server, server.key("batcher"))
    uploaded = c.files.create(file=("in.jsonl", batch_file(20)), purpose="batch")
    assert uploaded.bytes == len(batch_file(20)) and uploaded.purpose == "batch"
    assert c.files.content(uploaded.id).content == batch_file(20)
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                             completion_window="24h", metadata={"run": "nightly"})
    assert batch.status in ("in_progress", "completed") and batch.metadata == {"run": "nightly"}
    done = wait_batch(c, batch.id)
    assert done.status == "completed" and done.request_counts.total == 20
    assert (done.request_counts.completed, done.request_counts.failed) == (20, 0)
    lines = [json.loads(x) for x in c.files.content(done.output_file_id).content.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"id-{i}" for i in range(20)]
    assert all(x["response"]["status_code"] == 200 for x in lines)
    assert lines[0]["response"]["body"]["object"] == "chat.completion"
    assert c.files.content(done.error_file_id).content == b""
    assert c.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert done.id in [b.id for b in c.batches.list()]
    assert server.rows("SELECT class FROM jobs WHERE tenant = 'batcher'") == [("batch",)]
    assert c.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(uploaded.id)


def test_a_bad_line_fails_the_batch_and_nothing_runs(server):
    c = client(server, server.key("careless"))
    data = batch_file(3).replace(b'"temperature": 0', b'"temperature": 9', 1)
    uploaded = c.files.create(file=("bad.jsonl", data), purpose="batch")
    before = server.counts()
    batch = c.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h")
    assert batch.status == "failed" and batch.request_counts.total == 0
    (error,) = batch.errors.data
    assert error.line == 1 and error.param == "body.temperature"
    after = server.counts()
    assert after["jobs"] == before["jobs"] and after["requests"] == before["requests"]
    wrong_url = c.files.create(file=("u.jsonl", batch_file(2, url="/v1/completions")), purpose="batch")
    batch = c.batches.create(input_file_id=wrong_url.id, endpoint=CHAT_URL, completion_window="24h")
    assert batch.status == "failed" and batch.errors.data[0].line == 1


def test_cancelling_a_batch(server):
    c = client(server, server.key("canceller"))
    uploaded = c.files.create(file=("big.jsonl", batch_file(200, max_tokens=2000)), purpose="batch")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h")
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_batch(c, batch.id, until=("cancelled",), timeout=10)
    assert done.request_counts.completed < 200


def test_each_error_reaches_the_sdk_as_its_exception(server):
    key = server.key("errant", "streaming")
    c = client(server, key)
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="m", messages=CHAT, temperature=7)
    assert bad.value.body["param"] == "temperature" and bad.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError):
        client(server, key[:-1] + ("A" if key[-1] != "A" else "B")).models.list()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="sk-not-ours", base_url=f"{server.url}/v1", max_retries=0).models.list()
    with pytest.raises(openai.PermissionDeniedError):
        c.chat.completions.create(model="m", messages=CHAT, service_tier="priority")
    with pytest.raises(openai.NotFoundError):
        c.batches.retrieve("batch_nope")
    with pytest.raises(openai.APIStatusError) as too_big:
        c.completions.create(model="m", prompt="x" * (2 << 20), max_tokens=1)
    assert too_big.value.status_code == 413 and too_big.value.body["type"] == "invalid_request_error"


def test_the_queue_limit_answers_429_with_retry_after(server):
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission
    from fsched.core.types import RequestClass
    from fsched.storage.jobstore import SqlJobStore

    c = client(server, server.key("crowd"))
    jobs = SqlJobStore(server.env["FSCHED_DB"])
    parsed = parse_job_file(batch_file(200, max_tokens=2000), "long.jsonl")
    (job,) = jobs.submit([JobSubmission(parsed, "crowd", RequestClass.BATCH, 9, "long")])
    server.cli("limits", "set", "max_queued_per_tenant", "100")  # 200 queued: over it for seconds
    try:
        time.sleep(1.1)  # a server re-reads the stored limits every second
        with pytest.raises(openai.RateLimitError) as limited:
            c.completions.create(model="m", prompt="p", max_tokens=1)
        assert limited.value.response.headers["retry-after"] == "1"
    finally:
        server.cli("limits", "unset", "max_queued_per_tenant")
        jobs.cancel_job(job.job_id)
        jobs.db.dispose()


def test_a_revoked_key_is_refused_at_once(server):
    created = json.loads(server.cli("keys", "create", "leaver", "--json"))
    c = client(server, created["key"])
    assert c.completions.create(model="m", prompt="p", max_tokens=1).choices
    server.cli("keys", "revoke", created["id"])
    with pytest.raises(openai.AuthenticationError):
        c.completions.create(model="m", prompt="p", max_tokens=1)
    (listed,) = [k for k in json.loads(server.cli("keys", "list", "--json")) if k["id"] == created["id"]]
    assert listed["tenant"] == "leaver" and listed["revoked_at"] is not None and "key" not in listed


def test_one_tenant_cannot_see_anothers_files_batches_or_requests(server):
    alice, bob = client(server, server.key("alice")), client(server, server.key("bob"))
    uploaded = alice.files.create(file=("a.jsonl", batch_file(2)), purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
    for call in (lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(uploaded.id),
                 lambda: bob.files.delete(uploaded.id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "alice" not in str(missing.value.body)
    assert bob.files.list().data == [] and bob.batches.list().data == []
    assert alice.batches.retrieve(batch.id).id == batch.id  # still alice's, untouched


def test_a_client_that_disconnects_cancels_its_request(server):
    key = server.key("quitter")
    seed = long_seed(2000, messages=CHAT)
    body = {"model": "m", "messages": CHAT, "max_tokens": 2000, "stream": True, "seed": seed}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as response:
        for line in response.iter_lines():
            if '"content":"w' in line:
                break  # the first tokens came; now hang up
    deadline = time.time() + 5
    while time.time() < deadline:
        (state,) = server.rows("SELECT r.state FROM requests r JOIN jobs j ON j.id = r.job_id "
                               "WHERE j.tenant = 'quitter'")
        if state[0] == "cancelled":
            break
        time.sleep(0.05)
    assert state[0] == "cancelled"
    (tokens,) = server.rows("SELECT r.num_output_tokens FROM requests r JOIN jobs j ON j.id = r.job_id "
                            "WHERE j.tenant = 'quitter'")
    assert 0 < tokens[0] < 2000
    # A plain (unstreamed) request whose client gives up is cancelled too.
    with pytest.raises(httpx.ReadTimeout):
        body = {"model": "m", "prompt": "p", "max_tokens": 2000, "seed": long_seed(2000, prompt="p")}
        httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                   timeout=0.3)
    deadline = time.time() + 5
    while time.time() < deadline:
        states = [s for (s,) in server.rows("SELECT r.state FROM requests r JOIN jobs j ON j.id = r.job_id "
                                            "WHERE j.tenant = 'quitter' ORDER BY r.id")]
        if states[-1] == "cancelled":
            break
        time.sleep(0.05)
    assert states == ["cancelled", "cancelled"]


def test_metrics_and_health(server):
    c = client(server, server.key("measured", "realtime"))
    c.completions.create(model="m", prompt="p", max_tokens=3)
    text = httpx.get(server.metrics_url).text
    for name in ("fsched:time_to_first_token_seconds_bucket{class=\"realtime\"",
                 "fsched:e2e_request_latency_seconds_count{class=\"realtime\"}",
                 "fsched:generation_tokens_total{class=\"realtime\",tenant=\"measured\"} 3.0",
                 "fsched:num_requests_waiting", "fsched:tenant_entitled_share{tenant=\"measured\"}",
                 "fsched:daemons_alive 1.0", "fsched:kv_cache_usage_perc"):
        assert name in text, name
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "daemons_alive": 1}


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
def test_fuzzed_bodies_never_500_nor_change_the_table_unless_accepted(server, fuzz_key, path, raw):
    before = server.counts()
    response = httpx.post(f"{server.url}{path}", content=raw, timeout=30,
                          headers={"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    event(f"HTTP {response.status_code}")
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if error["code"] != "request_failed":  # accepted, then refused by the engine (too long)
            assert server.counts() == before


@pytest.fixture(scope="module")
def fuzz_key(server) -> str:
    return server.key("fuzzer", "streaming")


def test_no_daemon_is_503_at_once(server):
    """Last in the module: it stops the module's daemon."""
    key = server.key("lonely")
    daemon = server.procs[0]
    daemon.terminate()  # a stopped daemon says goodbye in the table: no longer alive
    daemon.wait(timeout=30)
    time.sleep(0.6)  # a server trusts what it read of the daemons for half a second
    before = server.counts()
    start = time.monotonic()
    with pytest.raises(openai.InternalServerError) as unavailable:
        client(server, key).completions.create(model="m", prompt="p", max_tokens=1)
    took = time.monotonic() - start
    assert unavailable.value.status_code == 503, unavailable.value.body
    assert took < 5, f"503 after {took:.1f} s"  # at once: no waiting for a daemon (loose for a busy CI)
    assert server.counts() == before
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "daemons_alive": 0}


def test_the_tiny_model_answers_over_http(tmp_path, model_cache):
    s = make_server(tmp_path, model_cache)
    key = s.key("tiny", "realtime")
    s.start_daemon()  # the built-in tiny model
    s.start_server()
    try:
        s.wait_ready(timeout=300)
        chunks = list(client(s, key).chat.completions.create(
            model="tiny", messages=CHAT, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        ((stored, tokens, prompt_tokens),) = s.rows(
            "SELECT output_text, num_output_tokens, prompt_tokens FROM requests")
        assert text == stored and text.strip()
        assert (chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens) == (tokens, prompt_tokens)
        assert prompt_tokens > 0
    finally:
        s.stop()
