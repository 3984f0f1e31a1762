"""What an open online stream gets when its path breaks: a daemon killed, the server stopped, a client
that stops reading, a key revoked. A real `fsched serve` and stand-in daemons in subprocesses.

Each test holds a request of each streaming API open at once (a chat or completions stream, and a
Responses stream): the rules are the same for both, and one server, one kill and one wait serve both.
The killed-daemon case runs over a remote engine's token interface too (the stand-in engine server,
whose greedy tokens are the stand-in's) and through fsched's vLLM front (its server over a stand-in
engine core): the daemon that takes over resumes the engine's streams. Its
requests are sampled: on a remote engine a resumed sampled request draws its tokens again from a
derived seed (docs/vllm.md), so the daemon stores such a request's tokens before it pushes them, and
what a client saw before the kill is still the record's beginning after it.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import TypeVar

import httpx
import pytest

from tests.support.fake_engine import FakeEngine
from tests.support.fake_front import FakeFront

from .http_server import Server, make_server
from .test_http import CHAT, CHAT_URL, long_seed, runs_long

pytestmark = pytest.mark.timeout(120)

TOKENS = 400
RESPONSES_URL = "/v1/responses"
T = TypeVar("T")


@pytest.fixture
def server(tmp_path) -> Server:
    s = make_server(tmp_path)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    yield s
    s.stop()


def start(server: Server, *serve_args: str, step: str = "20ms", engine: FakeEngine | None = None) -> None:
    server.start_daemon(*daemon_args(step, engine))
    server.start_server("--no-daemon-s", "3", "--stall-s", "1.5", *serve_args)
    server.wait_ready()


def daemon_args(step: str, engine: FakeEngine | FakeFront | None) -> tuple[str, ...]:
    """The stand-in run by the daemon at `step` a token, or, given an engine, the stand-in's ids sent to
    that engine over its token interface, or through fsched's vLLM front (the engine keeps its own pace)."""
    if engine is None:
        return ("--model", f"standin:{step}", "--lease-ttl", "3")
    api = "front" if isinstance(engine, FakeFront) else "tokens"
    return ("--model", "standin", "--engine", engine.url, "--engine-api", api, "--lease-ttl", "3")


@pytest.fixture(params=["builtin", "tokens", "front"])
def engine(request) -> Iterator[FakeEngine | FakeFront | None]:
    """None: the daemon runs the stand-in itself; else a stand-in engine server at 20 ms a token, or the
    front over a stand-in engine core at that pace."""
    if request.param == "builtin":
        yield None
        return
    fake = FakeFront(step_s=0.02) if request.param == "front" else FakeEngine(step_s=0.02)
    yield fake
    fake.stop()


def body(url: str, greedy: bool = False, on_engine: bool = False) -> dict:
    sampling = {"temperature": 0} if greedy else {}
    if url == CHAT_URL:
        seed = long_seed(TOKENS, messages=CHAT, engine_sampled=on_engine and not greedy)
        return {"model": "m", "messages": CHAT, "max_tokens": TOKENS, "stream": True, "seed": seed,
                **sampling}
    return {"model": "m", "input": CHAT, "max_output_tokens": TOKENS, "stream": True, **sampling}


def long_draw(server: Server, tenant: str, n: int, attempt: Callable[[], tuple[T, Callable]],
              engine_sampled: bool = False, **encoded):
    """(what `attempt()` opened, its job id), of the first request of the tenant's it opens whose stored
    seed has the stand-in generate `n` tokens without its end token (`encoded`: the prompt or messages;
    `engine_sampled`: the stand-in engine server's sampled draws, which differ from the stand-in's).
    The Responses API takes no seed: the server draws one, so a test that needs a long request opens
    it again (`close`s the short one) until a draw is long; a request with a long seed (long_seed) is
    kept at once."""
    ((last,),) = server.rows("SELECT coalesce(max(id), 0) FROM jobs WHERE tenant = ?", tenant)
    while True:
        opened, close = attempt()
        deadline = time.time() + 10
        while not (found := server.rows("SELECT j.id, r.params FROM requests r JOIN jobs j "
                                         "ON j.id = r.job_id WHERE j.tenant = ? AND j.id > ?", tenant, last)):
            assert time.time() < deadline, "the request was not stored"
            time.sleep(0.02)
        ((last, params),) = found  # one request opened at a time: its job is the tenant's newest
        if runs_long(n, json.loads(params)["seed"], engine_sampled=engine_sampled, **encoded):
            return opened, last
        close()


def row(server: Server, job_id: int) -> tuple:
    (found,) = server.rows("SELECT state, output_text FROM requests WHERE job_id = ?", job_id)
    return tuple(found)


def wait_state(server: Server, job_id: int, state: str, within_s: float = 10) -> str:
    deadline = time.time() + within_s
    while (found := row(server, job_id)[0]) != state and time.time() < deadline:
        time.sleep(0.05)
    return found


class Reader:
    """An SSE stream read line by line, chat's chunks or the Responses API's events: the content so far,
    keep-alive comments, error events, whether it ended."""

    def __init__(self, response: httpx.Response, job_id: int):
        self.lines, self.job_id = response.iter_lines(), job_id
        self.content, self.keepalives, self.errors, self.done = "", 0, [], False

    def until(self, stop) -> None:
        for line in self.lines:
            if line.startswith(":"):
                self.keepalives += 1
            elif line == "data: [DONE]":
                self.done = True
            elif line.startswith("data: "):
                self.read(json.loads(line[6:]))
            if stop(self):
                return

    def read(self, event: dict) -> None:
        kind = event.get("type")
        if "error" in event:
            if kind == "error":  # the Responses API's: its code at the top too
                assert event["code"] == event["error"]["code"] and "sequence_number" in event
            self.errors.append(event["error"])
        elif kind == "response.output_text.delta":
            self.content += event["delta"]
        elif kind in ("response.completed", "response.incomplete"):
            self.done = True
        else:
            for choice in event.get("choices", ()):
                self.content += choice["delta"].get("content") or ""


@contextmanager
def streams(server: Server, tenant: str, greedy: bool = False, on_engine: bool = False
            ) -> Iterator[list[Reader]]:
    """A chat stream, then a Responses stream, of a new key of `tenant`, both open and each running to
    TOKENS tokens unless stopped (`on_engine`: as the stand-in engine server draws them): their readers,
    in that order."""
    key = server.key(tenant)
    with ExitStack() as stack:
        readers = []
        for url in (CHAT_URL, RESPONSES_URL):
            attempt = partial(open_stream, server, key, url, greedy, on_engine)
            (one, response), job_id = long_draw(server, tenant, TOKENS, attempt, on_engine and not greedy,
                                                messages=CHAT)
            stack.push(one.pop_all())
            readers.append(Reader(response, job_id))
        yield readers


def open_stream(server: Server, key: str, url: str, greedy: bool = False, on_engine: bool = False
                ) -> tuple[tuple[ExitStack, httpx.Response], Callable]:
    one = ExitStack()
    payload = body(url, greedy, on_engine)
    response = one.enter_context(httpx.stream("POST", f"{server.url}{url}", json=payload,
                                              timeout=30, headers={"Authorization": f"Bearer {key}"}))
    return (one, response), one.close


def each_until(readers: list[Reader], stop) -> None:
    for reader in readers:
        reader.until(stop)


def test_a_killed_daemon_keeps_the_streams_alive_and_a_new_one_resumes_them_without_repeats(server, engine):
    # ample time for the successor to start on a loaded machine
    start(server, "--no-daemon-s", "30", engine=engine)
    with streams(server, "kept", on_engine=engine is not None) as readers:
        each_until(readers, lambda r: len(r.content) > 40)
        server.procs[0].send_signal(signal.SIGKILL)
        each_until(readers, lambda r: r.keepalives >= 1)  # no bytes of text come, but the streams are alive
        if engine is not None:
            engine.step_s = 0.001
            before = len(engine.bodies)
        server.start_daemon(*daemon_args("1ms", engine))  # back within --no-daemon-s
        each_until(readers, lambda r: r.done)
    assert [(r.errors, r.keepalives >= 1) for r in readers] == [([], True)] * 2
    if engine is not None:  # the successor resumed both streams on the engine, from the tokens stored
        api = "front" if isinstance(engine, FakeFront) else "tokens"
        assert set(engine.apis) == {api} and len(engine.bodies) - before >= 2, engine.bodies
    # What was pushed before the kill is not repeated. (A stream's end is pushed before its completion is
    # written: its row may still say running for a moment after the client read the end.)
    assert [wait_state(server, r.job_id, "done") for r in readers] == ["done"] * 2
    assert [row(server, r.job_id) for r in readers] == [("done", r.content) for r in readers]


def test_no_live_daemon_ends_the_streams_with_an_error_event_and_cancels_the_requests(server):
    start(server)
    started = time.monotonic()
    with streams(server, "orphan") as readers:
        each_until(readers, lambda r: len(r.content) > 10)
        server.procs[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        waited = []
        for reader in readers:
            reader.until(lambda r: bool(r.errors))
            waited.append(time.monotonic() - killed)
    assert [(r.errors[0]["code"], r.keepalives >= 1) for r in readers] == [("no_daemon", True)] * 2
    # Dead after its lease (3 s), then --no-daemon-s (3 s), checked once a second.
    assert all(5 < w < 12 for w in waited), (waited, time.monotonic() - started)
    # Cancelled: a running row waits for a daemon to drop it; its job says so now.
    for reader in readers:
        (cancel_requested,) = server.rows("SELECT cancel_requested_at FROM jobs WHERE id = ?", reader.job_id)
        assert cancel_requested[0] is not None


def test_stopping_the_server_cancels_its_open_streams(server):
    start(server)
    with streams(server, "stopped") as readers:
        each_until(readers, lambda r: len(r.content) > 10)
        server.procs[1].send_signal(signal.SIGTERM)
        each_until(readers, lambda r: bool(r.errors))
    assert [r.errors[0]["code"] for r in readers] == ["server_shutdown"] * 2
    # Not run on to the end.
    assert [wait_state(server, r.job_id, "cancelled") for r in readers] == ["cancelled"] * 2
    assert server.procs[1].wait(timeout=10) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal


def test_a_client_that_stops_reading_is_cut_off_and_its_request_cancelled(server):
    start(server, "--send-buffer-kb", "8", step="5ms")
    key = server.key("stalled")
    # Small buffers both ends, and big chunks (20 log probabilities a token): they fill fast, within some
    # 150 tokens; a Responses request (no seed) is drawn again until it would run 600.
    completion = {"model": "m", "prompt": "p", "max_tokens": 2000, "stream": True, "logprobs": 20,
                  "seed": long_seed(2000, prompt="p")}
    responses = {"model": "m", "input": CHAT, "max_output_tokens": 600, "stream": True, "top_logprobs": 20}
    clients = [("/v1/completions", completion, 2000, {"prompt": "p"}),
               (RESPONSES_URL, responses, 600, {"messages": CHAT})]
    opened = [long_draw(server, "stalled", n, partial(stalled_client, server, key, url, payload), **encoded)
              for url, payload, n, encoded in clients]
    socks, jobs = [sock for sock, _ in opened], [job for _, job in opened]
    try:
        # Cut off while generating, not run to their max tokens.
        assert [wait_state(server, job, "cancelled", within_s=30) for job in jobs] == ["cancelled"] * 2
        for sock in socks:
            sock.settimeout(10)
            while sock.recv(65536):  # what the buffers held, then the server's close
                pass
    finally:
        for sock in socks:
            sock.close()
    tokens = [server.rows("SELECT num_output_tokens FROM requests WHERE job_id = ?", j)[0][0] for j in jobs]
    assert 0 < tokens[0] < 2000 and 0 < tokens[1] < 600, tokens


def stalled_client(server: Server, key: str, url: str, payload: dict) -> tuple[socket.socket, Callable]:
    """A client that sends its request, then reads nothing, through a small receive buffer."""
    data = json.dumps(payload).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
                 + b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock, sock.close


def test_revoking_a_key_ends_its_open_streams(server):
    from fsched.storage.sql_keys import SqlKeyStore

    start(server)
    with streams(server, "revoked") as readers:
        each_until(readers, lambda r: len(r.content) > 10)
        keys = SqlKeyStore(server.env["FSCHED_DB"])
        try:
            (key,) = [k for k in keys.list_keys() if k.tenant == "revoked"]
            keys.revoke_key(key.id)
        finally:
            keys.db.dispose()
        revoked = time.monotonic()
        each_until(readers, lambda r: bool(r.errors))
    assert [r.errors[0]["code"] for r in readers] == ["invalid_api_key"] * 2
    # A stream reads its key again each second; the rest is slack for a loaded machine. Streams
    # that missed the revoke would run on to their TOKENS and end without this error.
    assert time.monotonic() - revoked < 15
    assert [wait_state(server, r.job_id, "cancelled") for r in readers] == ["cancelled"] * 2
