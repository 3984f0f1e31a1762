"""What an open online stream gets when its path breaks: a daemon killed, the server stopped, a client
that stops reading, a key revoked. A real `fsched serve` and stand-in daemons in subprocesses.
"""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import pytest

from fsched.core.jobs.apikeys import split_key

from .http_server import Server, make_server
from .test_http import CHAT, long_seed

pytestmark = pytest.mark.timeout(120)

TOKENS = 400


@pytest.fixture
def server(tmp_path) -> Server:
    s = make_server(tmp_path)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    yield s
    s.stop()


def start(server: Server, *serve_args: str, step: str = "20ms") -> None:
    server.start_daemon("--model", f"standin:{step}", "--lease-ttl", "3")
    server.start_server("--no-daemon-s", "3", "--stall-s", "1.5", *serve_args)
    server.wait_ready()


def body(max_tokens: int = TOKENS) -> dict:
    return {"model": "m", "messages": CHAT, "max_tokens": max_tokens, "stream": True,
            "seed": long_seed(max_tokens, messages=CHAT)}


def row(server: Server, tenant: str) -> tuple:
    found = server.rows("SELECT r.state, r.output_text FROM requests r JOIN jobs j ON j.id = r.job_id "
                        "WHERE j.tenant = ?", tenant)
    return found[0] if found else (None, None)


def wait_state(server: Server, tenant: str, state: str, within_s: float = 10) -> tuple:
    deadline = time.time() + within_s
    while (found := row(server, tenant))[0] != state and time.time() < deadline:
        time.sleep(0.05)
    return found


class Reader:
    """An SSE stream read line by line: the content so far, keep-alive comments, error events."""

    def __init__(self, response: httpx.Response):
        self.lines = response.iter_lines()
        self.content, self.keepalives, self.errors, self.done = "", 0, [], False

    def until(self, stop) -> None:
        for line in self.lines:
            if line.startswith(":"):
                self.keepalives += 1
            elif line == "data: [DONE]":
                self.done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    self.errors.append(event["error"])
                else:
                    for choice in event["choices"]:
                        self.content += choice["delta"].get("content") or ""
            if stop(self):
                return


def stream(server: Server, key: str, **kw):
    return httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body(**kw),
                        headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_killed_daemon_keeps_the_stream_alive_and_a_new_one_resumes_it_without_repeats(server):
    start(server)
    key = server.key("kept")
    with stream(server, key) as response:
        reader = Reader(response)
        reader.until(lambda r: len(r.content) > 40)
        server.procs[0].send_signal(signal.SIGKILL)
        reader.until(lambda r: r.keepalives >= 1)  # no bytes of text come, but the stream is alive
        server.start_daemon("--model", "standin:1ms", "--lease-ttl", "3")  # back within --no-daemon-s
        reader.until(lambda r: r.done)
    assert reader.errors == []
    state, text = row(server, "kept")
    assert state == "done" and reader.content == text  # what was pushed before the kill is not repeated


def test_no_live_daemon_ends_the_stream_with_an_error_event_and_cancels_the_request(server):
    start(server)
    key = server.key("orphan")
    started = time.monotonic()
    with stream(server, key) as response:
        reader = Reader(response)
        reader.until(lambda r: len(r.content) > 10)
        server.procs[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        reader.until(lambda r: bool(r.errors))
    waited = time.monotonic() - killed
    assert reader.errors[0]["code"] == "no_daemon" and reader.keepalives >= 1
    # Dead after its lease (3 s), then --no-daemon-s (3 s), checked once a second.
    assert 5 < waited < 12, (waited, time.monotonic() - started)
    # Cancelled: a running row waits for a daemon to drop it; its job says so now.
    (cancel_requested,) = server.rows("SELECT cancel_requested_at FROM jobs WHERE tenant = 'orphan'")
    assert cancel_requested[0] is not None


def test_stopping_the_server_cancels_its_open_streams(server):
    start(server)
    key = server.key("stopped")
    with stream(server, key) as response:
        reader = Reader(response)
        reader.until(lambda r: len(r.content) > 10)
        server.procs[1].send_signal(signal.SIGTERM)
        reader.until(lambda r: bool(r.errors))
    assert reader.errors[0]["code"] == "server_shutdown"
    assert wait_state(server, "stopped", "cancelled")[0] == "cancelled"  # not run on to the end
    assert server.procs[1].wait(timeout=10) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal


def test_a_client_that_stops_reading_is_cut_off_and_its_request_cancelled(server):
    start(server, "--send-buffer-kb", "8", step="5ms")
    key = server.key("stalled")
    # Small buffers both ends, and big chunks (20 log probabilities a token): they fill fast.
    payload = json.dumps({"model": "m", "prompt": "p", "max_tokens": 2000, "stream": True, "logprobs": 20,
                          "seed": long_seed(2000, prompt="p")}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    try:
        state, _ = wait_state(server, "stalled", "cancelled", within_s=30)
        assert state == "cancelled"  # cut off while generating, not run to its 2000 tokens
        sock.settimeout(10)
        while sock.recv(65536):  # what the buffers held, then the server's close
            pass
    finally:
        sock.close()
    (tokens,) = server.rows("SELECT r.num_output_tokens FROM requests r JOIN jobs j ON j.id = r.job_id "
                            "WHERE j.tenant = 'stalled'")
    assert 0 < tokens[0] < 2000


def test_revoking_a_key_ends_its_open_streams(server):
    from fsched.storage.sql_keys import SqlKeyStore

    start(server)
    key = server.key("revoked")
    with stream(server, key) as response:
        reader = Reader(response)
        reader.until(lambda r: len(r.content) > 10)
        keys = SqlKeyStore(server.env["FSCHED_DB"])
        try:
            keys.revoke_key(split_key(key)[0])
        finally:
            keys.db.dispose()
        revoked = time.monotonic()
        reader.until(lambda r: bool(r.errors))
    assert reader.errors[0]["code"] == "invalid_api_key" and time.monotonic() - revoked < 3
    assert wait_state(server, "revoked", "cancelled")[0] == "cancelled"
