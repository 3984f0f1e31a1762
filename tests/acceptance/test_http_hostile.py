"""Hostile inputs at the front door that need the real processes: a real `fsched serve` and a stand-in
daemon, on SQLite and on PostgreSQL. Each refused request answers a 4xx in OpenAI's error shape and leaves
the table as it was; nothing a client sends gets a 5xx or leaves a tenant's objects unreadable.

Here: text no column takes (PostgreSQL's jsonb refuses NUL and lone surrogates) through the real server
to each real database; an oversize upload in chunked transfer encoding; the metrics listener bound to
loopback; clients that dribble their headers or body. Every other hostile input is tested in process
(tests/unit/test_front_door.py).
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text

from ..conftest import PG_ADMIN_URL, _pg_admin_connect
from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(180)
TABLES = ("jobs", "requests", "files", "batches")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory) -> Server:
    s = make_server(tmp_path_factory.mktemp("hostile"))
    name = None
    if request.param == "postgresql":
        name = f"fsched_test_{uuid.uuid4().hex[:12]}"
        try:
            with _pg_admin_connect() as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        except Exception:  # noqa: BLE001 - no PostgreSQL here
            pytest.skip("PostgreSQL is not reachable")
        s.env["FSCHED_DB"] = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    s.start_daemon("--model", "standin:1ms")
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()
    if name is not None:
        with _pg_admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def snapshot(server: Server) -> dict:
    """Every row of the tables a request may add to (what "the table is unchanged" compares)."""
    engine = create_engine(server.env["FSCHED_DB"])
    try:
        with engine.connect() as conn:
            return {t: sorted(map(repr, conn.execute(text(f"SELECT * FROM {t}")).all())) for t in TABLES}
    finally:
        engine.dispose()


def http(server: Server, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.key(tenant)}"},
                        timeout=60)


def openai_error(response: httpx.Response, status: int) -> dict:
    """The body of an error in OpenAI's shape, after checking its status."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str)
    return error


def upload(c: httpx.Client, content: bytes) -> str:
    r = c.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def batch_lines(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "m", "prompt": "p", "max_tokens": 2}}) + "\n"
                   for i in range(n)).encode()


def raw_json(c: httpx.Client, path: str, body: str) -> httpx.Response:
    """`body` sent as it is written (json.dumps would escape a lone surrogate in its own way)."""
    return c.post(path, content=body.encode(), headers={"Content-Type": "application/json"})


def test_a_lone_surrogate_in_batch_metadata_is_refused_and_the_list_stays_readable(server):
    c = http(server, "surrogate-meta")
    file_id = upload(c, batch_lines(2))
    before = snapshot(server)
    for meta in ('{"k": "\\ud800"}', '{"\\udfff": "v"}', '{"k": "a\\u0000b"}'):
        body = f'{{"input_file_id": "{file_id}", "endpoint": "/v1/completions", ' \
               f'"completion_window": "24h", "metadata": {meta}}}'
        error = openai_error(raw_json(c, "/v1/batches", body), 400)
        assert error["param"] == "metadata", error
    assert snapshot(server) == before
    listed = c.get("/v1/batches")
    assert listed.status_code == 200 and listed.json()["data"] == []


def test_an_oversize_chunked_upload_is_413_with_its_reason(server):
    c = http(server, "chunked")
    before = snapshot(server)
    limit = 250 * 1024 * 1024

    def body():
        boundary = b"--xx\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n"
        yield boundary
        chunk = b"x" * (1 << 20)
        for _ in range(limit // len(chunk) + 2):
            yield chunk

    r = c.post("/v1/files", content=body(), headers={"Content-Type": "multipart/form-data; boundary=xx"})
    error = openai_error(r, 413)
    assert "over the limit" in error["message"]
    assert snapshot(server) == before


def test_metrics_are_served_on_the_loopback_metrics_port_only(server):
    c = http(server, "metrics-reader")
    assert openai_error(c.get("/metrics"), 404)["message"] == "no such endpoint"
    assert openai_error(httpx.get(f"{server.url}/metrics"), 404)
    scraped = httpx.get(server.metrics_url, timeout=10)
    assert scraped.status_code == 200 and "fsched:daemons_alive 1.0" in scraped.text
    assert httpx.get(server.metrics_url.replace("/metrics", "/v1/models"), timeout=10).status_code == 404
    with pytest.raises(httpx.ConnectError):  # bound to loopback alone
        httpx.get(f"http://{outward_address()}:{server.metrics_port}/metrics", timeout=2)


def outward_address() -> str:
    """An address of this machine other than loopback (the one a route out leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
        address = s.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no address but loopback")
    return address


def open_socket(server: Server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return s


# How long a test waits for the server to cut a slow client off. Generous: without the deadlines uvicorn
# never closes a connection that sends nothing yet, nor one that sends a byte now and then, so a loaded
# machine decides only how long a passing test takes.
CUT_OFF_S = 30.0


def until_closed(s: socket.socket, dribble: bool) -> tuple[float, bytes]:
    """Seconds until the server closes `s`, and what it sent meanwhile; with `dribble`, a byte every
    0.2 s in the meantime (each resets uvicorn's own idle timer). Fails past CUT_OFF_S."""
    start = time.monotonic()
    s.settimeout(0.2)
    received = b""
    while time.monotonic() - start < CUT_OFF_S:
        try:
            chunk = s.recv(4096)
        except TimeoutError:
            if dribble:
                try:
                    s.sendall(b"X")
                except (BrokenPipeError, ConnectionResetError):  # closed between two reads
                    break
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    else:
        pytest.fail(f"the server kept a slow client's connection past {CUT_OFF_S} s")
    return time.monotonic() - start, received


def read_response(s: socket.socket) -> bytes:
    """One whole response (its body sized by Content-Length) from `s`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096) or pytest.fail(f"closed before a whole response: {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += s.recv(4096) or pytest.fail(f"closed before a whole response: {data!r}")
    return head + b"\r\n\r\n" + body


@pytest.fixture(scope="module")
def impatient(tmp_path_factory) -> Server:
    """A server with short client deadlines (no daemon: no request here gets as far as one)."""
    s = make_server(tmp_path_factory.mktemp("impatient"))
    s.cli("limits", "show")
    s.start_server("--header-timeout", "1", "--body-timeout", "1.5")
    deadline = time.time() + 60
    while True:
        try:
            httpx.get(f"{s.url}/health", timeout=2)
            break
        except httpx.HTTPError:
            assert time.time() < deadline
            time.sleep(0.1)
    yield s
    s.stop()


def test_clients_that_dribble_headers_are_cut_off(impatient):
    silent = open_socket(impatient)  # connects, sends nothing
    dribbler = open_socket(impatient)
    dribbler.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert until_closed(dribbler, dribble=True)[1] == b""  # closed, not answered
    assert until_closed(silent, dribble=False)[1] == b""
    # A request in time, then the next one's headers dribbled: the deadline starts again at the end of
    # each response (uvicorn's idle timer alone would close it only if it went quiet).
    kept = open_socket(impatient)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(kept).startswith(b"HTTP/1.1 200 OK")
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert until_closed(kept, dribble=True)[1] == b""


def test_clients_that_dribble_a_body_get_408(impatient):
    key = impatient.key("slow-body")
    s = open_socket(impatient)
    start = time.monotonic()  # before the headers go: the server's deadline cannot start earlier
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
    _, answer = until_closed(s, dribble=True)  # a byte of the body now and then
    # The server's timer runs on its event loop's clock, which uvloop reads once a loop pass and keeps in
    # whole milliseconds: it can fire a millisecond or two before 1.5 s of this process's clock.
    assert time.monotonic() - start >= 1.5 - 0.01, "answered before the body's deadline"
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and "1.5 s" in error["message"]
