"""`fsched serve` end to end: the real `openai` SDK over real sockets against a server and a daemon in
subprocesses, on SQLite.

One server and one stand-in daemon (1 ms a step) serve the whole module; each
test makes its own keys, so its tenants are its own. What the API answers, case
by case, is tested in process (tests/unit/test_http_api.py, test_front_door.py):
here, that the real processes serve it (a completion, a stream, a batch through
the daemon process, a client's socket closing, a daemon stopping; the tiny model's stream and the
usage it reports are tests/acceptance/test_clients.py's, on that module's tiny-model server).
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from fsched.api.state import DAEMONS_TTL_S
from tests.support.seeds import long_seed, runs_long

from .http_server import Server, make_server

__all__ = ["CHAT", "CHAT_URL", "long_seed", "runs_long"]  # what test_online_path.py shares

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


def test_models_and_a_completion(server):
    c = client(server, server.key("models"))
    assert [m.id for m in c.models.list().data] == ["fsched-standin (no model)"]
    done = c.completions.create(model="any", prompt="one two three", max_tokens=5, temperature=0, seed=1)
    assert done.object == "text_completion" and done.model == "any"
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].text.split()) == 5
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (3, 5, 8)
    chat = c.chat.completions.create(model="m", messages=CHAT, max_completion_tokens=3, stop=["never"],
                                     extra_body={"ignore_eos": True})
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


def test_no_daemon_is_503_at_once(server):
    """Last in the module: it stops the module's daemon."""
    key = server.key("lonely")
    daemon = server.procs[0]
    daemon.terminate()  # a stopped daemon says goodbye in the table: no longer alive
    daemon.wait(timeout=30)
    time.sleep(DAEMONS_TTL_S + 0.1)  # what a server read of the daemons, it trusts this long
    before = server.counts()
    start = time.monotonic()
    with pytest.raises(openai.InternalServerError) as unavailable:
        client(server, key).completions.create(model="m", prompt="p", max_tokens=1)
    took = time.monotonic() - start
    assert unavailable.value.status_code == 503, unavailable.value.body
    assert took < 5, f"503 after {took:.1f} s"  # at once: no waiting for a daemon (loose for a busy CI)
    assert server.counts() == before
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "daemons_alive": 0}
