"""No schema can crash or stall a shared process: a real `fsched serve` and a daemon on the built-in tiny
model, a hostile tenant sending the schemas that once crashed or stalled them, and an honest tenant
measured meanwhile (its streams and requests: never `no_daemon`, never a 503, the first token within
HONEST_FIRST_TOKEN_S; `/health` answered within HEALTH_S).

The defects, each a test: a `$ref` chain that segfaulted the grammar library inside serve (chat
completions and a batch's input line); a schema with tens of thousands of properties that held serve's
event loop; a 5,000-property schema with n=16 whose matchers the daemon built inside its step loop; a
schema past the grammar library's own limits whose answer ended as `"{"` with finish_reason "stop".
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(300)
# Bounds on a shared, loaded 2-core machine (the tiny model's first token takes well under a second idle;
# 4 to 5.6 s were seen at a load average of 20, while the attack's compiles shared the two cores).
HONEST_FIRST_TOKEN_S = 10.0
HEALTH_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    s = make_server(tmp_path_factory.mktemp("grammar"))
    s.cli("limits", "show")
    s.start_daemon()  # the built-in tiny model: its runner builds real grammar matchers
    s.start_server()
    s.wait_ready(timeout=240)
    yield s
    s.stop()


def ref_chain(links: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def properties(count: int, required: bool) -> dict:
    """An object of `count` integer properties (named afresh each call: no cache hit between tests)."""
    tag = uuid.uuid4().hex[:6]
    props = {f"{tag}{i}": {"type": "integer"} for i in range(count)}
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = list(props)
    return schema


def chat(schema: dict | None = None, n: int = 1, max_tokens: int = 16, stream: bool = False) -> dict:
    body = {"model": "any", "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
            "n": n, "stream": stream}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    return body


def client(server: Server, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.key(tenant)}"},
                        timeout=120)


@dataclass
class Honest:
    """An honest tenant streaming chat answers one after another, each measured, until stopped."""

    server: Server
    first_token_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    finished: int = 0  # streams ended, answered or not
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Honest:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(120)

    def _run(self) -> None:
        with client(self.server, "honest") as c:
            while not self.stop.is_set():
                self._one(c)
                with self.changed:
                    self.finished += 1
                    self.changed.notify_all()

    def wait_streams(self, count: int, timeout: float = 60) -> None:
        """Until `count` more streams have ended from now."""
        with self.changed:
            goal = self.finished + count
            assert self.changed.wait_for(lambda: self.finished >= goal, timeout), \
                f"the honest tenant ended {self.finished - goal + count} of {count} streams in {timeout} s"

    def _one(self, c: httpx.Client) -> None:
        start = time.monotonic()
        first = None
        try:
            # ignore_eos: the random tiny model, sampled, can draw its end token first (no token to time).
            body = {**chat(max_tokens=8, stream=True), "ignore_eos": True}
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    self.failures.append(f"{r.status_code} {r.read().decode()[:200]}")
                    return
                for line in r.iter_lines():
                    if first is None and _has_content(line):
                        first = time.monotonic() - start
                    if '"error"' in line:
                        self.failures.append(line[:200])
        except httpx.HTTPError as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return
        if first is None:
            self.failures.append("a stream without a token")
        else:
            self.first_token_s.append(first)

    def check(self) -> None:
        """No failure; at least one answer; every first token within the bound."""
        assert not self.failures, self.failures
        assert self.first_token_s, "the honest tenant got no answer during the attack"
        assert max(self.first_token_s) < HONEST_FIRST_TOKEN_S, self.first_token_s


def _has_content(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def health_delays(server: Server, until: threading.Event) -> list[float]:
    """`/health`'s answer times, polled every 50 ms until `until` (a failed poll counts as 99 s)."""
    delays = []
    while not until.is_set():
        start = time.monotonic()
        try:
            httpx.get(f"{server.url}/health", timeout=30).raise_for_status()
            delays.append(time.monotonic() - start)
        except httpx.HTTPError:
            delays.append(99.0)
        time.sleep(0.05)
    return delays


def refused_for_response_format(r: httpx.Response, why: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith("response_format"), error
    assert why in error["message"], error


def test_a_ref_chain_is_refused_and_serve_lives(server):
    with Honest(server) as honest, client(server, "hostile") as c:
        for links in (3000, 1000):  # 3,000: the segfault; 1,000: a chain too deep, stopped by the limit
            refused_for_response_format(c.post("/v1/chat/completions", json=chat(ref_chain(links))), "$ref")
        assert httpx.get(f"{server.url}/health", timeout=HEALTH_S).status_code == 200
        honest.wait_streams(2)  # the one under way, and one begun after the attack
    honest.check()


def test_a_ref_chain_in_a_batch_line_is_refused_and_serve_lives(server):
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": chat(ref_chain(3000))}
    with Honest(server) as honest, client(server, "hostile") as c:
        up = c.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode() + b"\n")},
                    data={"purpose": "batch"})
        assert up.status_code == 200, up.text
        r = c.post("/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                                        "completion_window": "24h"})
        assert r.status_code in (200, 400), r.text
        if r.status_code == 200:  # a batch refused for its lines: failed, each line's error named
            batch = r.json()
            assert batch["status"] == "failed", batch
            assert "response_format" in json.dumps(batch["errors"]), batch
        assert httpx.get(f"{server.url}/health", timeout=HEALTH_S).status_code == 200
        honest.wait_streams(2)  # the one under way, and one begun after the attack
    honest.check()


def test_huge_schemas_never_hold_the_event_loop(server):
    done = threading.Event()
    found: list[float] = []
    poller = threading.Thread(target=lambda: found.extend(health_delays(server, done)), daemon=True)
    with Honest(server) as honest, client(server, "hostile") as c:
        poller.start()
        # 25,000 optional properties: refused at once. Four schemas of 5,000 required properties at once:
        # within every limit, each compiled in the isolated worker (seconds) while the loop serves others.
        refused_for_response_format(c.post("/v1/chat/completions", json=chat(properties(25_000, False))), "")
        with ThreadPoolExecutor(4) as pool:
            bodies = [chat(properties(5_000, True), max_tokens=4) for _ in range(4)]
            answers = list(pool.map(lambda body: c.post("/v1/chat/completions", json=body), bodies))
        assert [r.status_code for r in answers] == [200] * 4, [r.text[:200] for r in answers]
        done.set()
        poller.join(60)
    honest.check()
    assert found and max(found) < HEALTH_S, found


def test_a_large_schema_with_n16_does_not_stall_the_daemon(server):
    schema = properties(5_000, True)
    with Honest(server) as honest, client(server, "hostile") as c:
        honest.wait_streams(1)  # streaming already when the attack comes
        start = time.monotonic()
        r = c.post("/v1/chat/completions", json=chat(schema, n=16, max_tokens=8))
        took = time.monotonic() - start
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        assert len(choices) == 16 and all(ch["finish_reason"] == "length" for ch in choices), choices
        honest.wait_streams(2)  # the one under way, and one begun after the attack
    honest.check()
    assert took < 60, took


def test_a_schema_past_the_grammar_librarys_limits_is_refused_not_answered_with_broken_json(server):
    # 1,000 optional properties: the grammar library's parser row overflows at the object's first
    # token, which once ended the answer as "{" with finish_reason "stop".
    with client(server, "hostile") as c:
        r = c.post("/v1/chat/completions", json=chat(properties(1_000, False), max_tokens=16))
    refused_for_response_format(r, "optional properties")
