"""Hostile inputs at the front door: a real `fsched serve` and a stand-in daemon, on SQLite and on
PostgreSQL. Each refused request answers a 4xx in OpenAI's error shape and leaves the table as it was;
nothing a client sends gets a 5xx or leaves a tenant's objects unreadable.
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
from .test_http import long_seed

pytestmark = pytest.mark.timeout(180)
QUEUE_LIMIT = 40
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
    s.cli("limits", "set", "max_queued_per_tenant", str(QUEUE_LIMIT))
    s.start_daemon("--model", "standin:3ms")  # a long request takes seconds: the expiry test's
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


def test_a_lone_surrogate_in_an_id_is_a_clean_error(server):
    c = http(server, "surrogate-id")
    before = snapshot(server)
    body = '{"input_file_id": "file-\\ud800", "endpoint": "/v1/completions", "completion_window": "24h"}'
    error = openai_error(raw_json(c, "/v1/batches", body), 400)
    assert error["param"] == "input_file_id"
    for path in ("/v1/files/%ED%A0%80", "/v1/batches/%ED%A0%80", "/v1/files/%ED%A0%80/content",
                 "/v1/files/\udcff".encode("utf-8", "surrogateescape").decode("latin-1")):
        assert c.get(path).status_code == 404
    openai_error(c.get("/v1/batches/batch_%ED%A0%80"), 404)
    openai_error(c.post("/v1/batches/%ED%A0%80/cancel"), 404)
    openai_error(c.delete("/v1/files/%ED%A0%80"), 404)
    assert snapshot(server) == before


@pytest.mark.parametrize("field, value", [("top_p", 1e-300), ("temperature", 1e-45), ("top_p", 5e-324),
                                          ("temperature", 1e-300)])
def test_tiny_sampling_values_never_crash_the_engine(server, field, value):
    """A sampling value next to zero is answered as its limit (greedy, or the one likeliest token):
    the same answer as temperature 0, with a co-running request unharmed."""
    c = http(server, f"tiny-{field}")
    body = {"model": "m", "prompt": "one two three", "max_tokens": 8, "seed": 3, field: value}
    greedy = c.post("/v1/completions", json={**body, field: 0 if field == "temperature" else 1,
                                             "temperature": 0})
    assert greedy.status_code == 200, greedy.text
    tiny = c.post("/v1/completions", json=body)
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


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


def test_a_streamed_request_over_the_context_is_400_before_any_stream(server):
    c = http(server, "over-context")
    body = {"model": "m", "prompt": "word " * 9000, "max_tokens": 4}
    plain = openai_error(c.post("/v1/completions", json=body), 400)
    with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        r.read()
        streamed = openai_error(r, 400)
    assert streamed["message"] == plain["message"] and "context" in plain["message"]


def test_a_batch_larger_than_the_queue_limit_is_400_not_429(server):
    c = http(server, "too-big")
    file_id = upload(c, batch_lines(QUEUE_LIMIT + 1))
    before = snapshot(server)
    r = c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                    "completion_window": "24h"})
    error = openai_error(r, 400)
    assert f"larger than your queue limit of {QUEUE_LIMIT}" in error["message"]
    assert "retry-after" not in r.headers
    assert snapshot(server) == before
    fits = c.post("/v1/batches", json={"input_file_id": upload(c, batch_lines(QUEUE_LIMIT)),
                                       "endpoint": "/v1/completions", "completion_window": "24h"})
    assert fits.status_code == 200, fits.text


def test_online_ids_are_opaque_and_other_tenants_objects_stay_hidden(server):
    mine, theirs = http(server, "ids-a"), http(server, "ids-b")
    ids = []
    asks = (("/v1/completions", {"prompt": "p", "max_tokens": 1}),
            ("/v1/chat/completions", {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 1}))
    for c in (mine, theirs, mine):
        ids += [c.post(path, json={"model": "m", **body}).json()["id"] for path, body in asks]
    with mine.stream("POST", "/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 2,
                                                     "stream": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: {"))
    ids.append(json.loads(first[6:])["id"])
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"(cmpl-|chatcmpl-)[0-9a-f]{24}|resp_[0-9a-f]{48}", i) for i in ids), ids
    file_id = upload(mine, batch_lines(1))
    batch = mine.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                           "completion_window": "24h"}).json()["id"]
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch}"):
        assert openai_error(theirs.get(path), 404)["code"] == "not_found"
    assert openai_error(theirs.post(f"/v1/batches/{batch}/cancel"), 404)["code"] == "not_found"


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


def closed_within(s: socket.socket, seconds: float) -> float:
    """Seconds until the server closes `s` (reading what it sends), failing past `seconds`."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        pytest.fail(f"the server kept a slow client's connection past {seconds} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - start


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
    for _ in range(3):  # a byte now and then: each once reset uvicorn's idle timer
        time.sleep(0.4)
        dribbler.sendall(b"X")
    assert closed_within(silent, 5) < 3
    assert closed_within(dribbler, 5) < 3
    kept = open_socket(impatient)  # a request in time, then idle: closed by the same deadline
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200 OK" in kept.recv(4096)
    assert closed_within(kept, 5) < 3


def test_clients_that_dribble_a_body_get_408(impatient):
    key = impatient.key("slow-body")
    s = open_socket(impatient)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
    start = time.monotonic()
    s.settimeout(0.2)
    answer = b""
    while time.monotonic() - start < 10:
        try:
            chunk = s.recv(4096)
        except TimeoutError:
            s.sendall(b" ")  # a byte of the body now and then
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        answer += chunk
    assert 1.4 < time.monotonic() - start < 5
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and "1.5 s" in error["message"]


def test_the_file_list_pages_as_the_other_lists(server):
    c = http(server, "pager")
    made = [upload(c, batch_lines(1)) for _ in range(5)]
    pages, after = [], None
    while True:
        page = c.get("/v1/files", params={"limit": 2, **({"after": after} if after else {})}).json()
        pages.append([f["id"] for f in page["data"]])
        assert page["first_id"] == pages[-1][0] and page["last_id"] == pages[-1][-1]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert [len(p) for p in pages] == [2, 2, 1]
    newest_first = [i for p in pages for i in p]
    assert sorted(newest_first) == sorted(made) and len(set(newest_first)) == 5
    oldest_first = c.get("/v1/files", params={"order": "asc"}).json()["data"]
    assert [f["id"] for f in oldest_first] == newest_first[::-1]
    assert c.get("/v1/files", params={"order": "asc", "after": oldest_first[2]["id"]}).json()["data"] \
        == oldest_first[3:]
    other = http(server, "pager-other")
    assert other.get("/v1/files", params={"after": made[0]}).json()["data"] == []
    for bad in ({"limit": 0}, {"limit": 10_001}, {"order": "sideways"}, {"limit": "x"}):
        openai_error(c.get("/v1/files", params=bad), 400)


def test_a_batch_past_its_completion_window_expires_with_its_partial_output(server):
    c = http(server, "windowed")
    lines = [{"custom_id": f"short-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "m", "prompt": "p", "max_tokens": 2}} for i in range(3)]
    # 2,000 tokens without the stand-in's end token: 6 s at 3 ms a step
    long = {"model": "m", "prompt": "p", "max_tokens": 2000, "seed": long_seed(2000, prompt="p")}
    lines += [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/completions", "body": long}
              for i in range(2)]
    file_id = upload(c, "".join(json.dumps(x) + "\n" for x in lines).encode())
    for window in ("25h", "0s", "1d", "soon", "-3h"):
        openai_error(c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                 "completion_window": window}), 400)
    made = c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                       "completion_window": "2s"}).json()
    assert made["expires_at"] - made["created_at"] in (1, 2)  # whole seconds of times 2 s apart
    deadline = time.time() + 30
    while (batch := c.get(f"/v1/batches/{made['id']}").json())["status"] != "expired":
        assert batch["status"] in ("in_progress", "finalizing") and time.time() < deadline, \
            batch["request_counts"]
        time.sleep(0.2)
    assert batch["expired_at"] >= made["created_at"] + 1 and batch["completed_at"] is None
    assert batch["request_counts"] == {"total": 5, "completed": 3, "failed": 2}
    def content(file_id: str) -> list[dict]:
        return [json.loads(x) for x in c.get(f"/v1/files/{file_id}/content").text.splitlines()]

    done = content(batch["output_file_id"])
    assert sorted(x["custom_id"] for x in done) == ["short-0", "short-1", "short-2"]
    unfinished = content(batch["error_file_id"])
    assert sorted(x["custom_id"] for x in unfinished) == ["long-0", "long-1"]
    assert {x["error"]["code"] for x in unfinished} == {"batch_expired"}

