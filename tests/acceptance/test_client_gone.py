"""Clients that go away from their streams, against a real `fsched serve` whose log is read: each is
one INFO line (who, which path, why), never an ERROR or a traceback, so no tenant can flood the log by
hanging up or by not reading. Their requests are cancelled all the same."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.support.seeds import long_seed

from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(120)
CHAT = [{"role": "user", "content": "hello there"}]
GONE = "left its stream (POST /v1/chat/completions) before the end"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    s = make_server(tmp_path_factory.mktemp("gone"))
    s.cli("limits", "show")
    s.start_daemon("--model", "standin:1ms")
    s.start_server("--stall-s", "1", "--send-buffer-kb", "4", log=s.root / "serve.log")
    s.wait_ready()
    yield s
    s.stop()


def long_stream(tokens: int = 3000) -> dict:
    return {"model": "m", "messages": CHAT, "max_tokens": tokens, "stream": True,
            "seed": long_seed(tokens, messages=CHAT)}


def log_lines(server: Server, count: int, timeout: float = 20) -> list[str]:
    """Serve's log once it holds `count` lines about clients gone (or at `timeout`)."""
    deadline = time.time() + timeout
    while True:
        lines = (server.root / "serve.log").read_text().splitlines()
        if sum(GONE in line for line in lines) >= count or time.time() > deadline:
            return lines
        time.sleep(0.1)


def states(server: Server, tenant: str) -> list[str]:
    return [s for (s,) in server.rows("SELECT r.state FROM requests r JOIN jobs j ON j.id = r.job_id "
                                      "WHERE j.tenant = ? ORDER BY r.id", tenant)]


def test_a_client_that_hangs_up_or_stops_reading_is_one_info_line(server):
    key = server.key("leaver")
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=long_stream(),
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as response:
        for line in response.iter_lines():
            if '"content":"w' in line:
                break  # the first tokens came; now hang up
    staller = socket.socket()
    staller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    staller.connect(("127.0.0.1", server.port))
    body = json.dumps(long_stream()).encode()
    staller.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body)  # and never reads
    lines = log_lines(server, 2)
    staller.close()
    gone = [line for line in lines if GONE in line]
    assert len(gone) == 2, lines
    assert all(line.startswith("INFO:") for line in gone), gone
    assert sum("disconnected" in line for line in gone) == 1 and sum("took no bytes for 1 s" in line
                                                                      for line in gone) == 1, gone
    assert not [line for line in lines if "Traceback" in line or line.startswith("ERROR")], lines
    deadline = time.time() + 10
    while states(server, "leaver") != ["cancelled", "cancelled"] and time.time() < deadline:
        time.sleep(0.1)
    assert states(server, "leaver") == ["cancelled", "cancelled"]


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory) -> Server:
    """A daemon whose every step takes half a second: a stream's first token comes that long after it runs."""
    s = make_server(tmp_path_factory.mktemp("gone-early"))
    s.start_daemon("--model", "standin:500ms")
    s.start_server(log=s.root / "serve.log")
    s.wait_ready()
    yield s
    s.stop()


def test_a_client_that_hangs_up_before_its_first_token_is_no_error_and_its_request_is_cancelled(slow_server):
    """The stream's head waits for its first token; a client gone meanwhile ends that wait: no error in the
    log, and the request is cancelled, not run to its end."""
    key = slow_server.key("early")
    body = json.dumps(long_stream(20)).encode()
    client = socket.create_connection(("127.0.0.1", slow_server.port))
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                   + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 10
    while not states(slow_server, "early") and time.time() < deadline:
        time.sleep(0.02)
    client.close()  # stored, its first token half a second away at least
    while states(slow_server, "early") != ["cancelled"] and time.time() < deadline + 10:
        time.sleep(0.1)
    assert states(slow_server, "early") == ["cancelled"]
    (made,) = [n for (n,) in slow_server.rows("SELECT r.num_output_tokens FROM requests r JOIN jobs j ON "
                                              "j.id = r.job_id WHERE j.tenant = ?", "early")]
    assert made < 20  # at most the step that ran while the cancel came
    lines = (slow_server.root / "serve.log").read_text().splitlines()
    assert not [line for line in lines if "Traceback" in line or line.startswith("ERROR")], lines

