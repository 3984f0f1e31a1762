"""fsched's vLLM front (core/runners/vllm_front.py) on a real socket, over the stand-in engine core.

A raw client speaks the front's lines here: the greeting, adds and aborts,
one line an engine iteration, a batch request's tokens held to its chunks,
a connection's requests aborted when it closes, refusals for that request
alone. The daemon's side is tests/integration/test_remote_runner.py's.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from fsched.core.runners.front_link import FrontClient
from fsched.core.runners.vllm_front import PROTOCOL
from tests.support.fake_engine import expected_tokens
from tests.support.fake_front import FakeFront

pytestmark = pytest.mark.timeout(60)


class Client:
    def __init__(self, front: FakeFront, hello: object = None):
        self.sock = socket.create_connection(("127.0.0.1", front.port), timeout=5)
        self.buf = b""
        self.send({"hello": PROTOCOL} if hello is None else hello)
        self.greeting = self.line()

    def send(self, message: object) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def line(self) -> object:
        while b"\n" not in self.buf:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def until_done(self, ids: set[str]) -> dict[str, list]:
        """Every entry until each of `ids` has ended, by id."""
        seen: dict[str, list] = {rid: [] for rid in ids}
        left = set(ids)
        while left:
            for entry in self.line():
                seen.setdefault(entry[0], []).append(entry)
                if entry[2] is not None or entry[4] is not None:
                    left.discard(entry[0])
        return seen

    def close(self) -> None:
        self.sock.close()


def add(client: Client, rid: str, prompt: list[int], **sampling) -> None:
    client.send(["add", rid, {"token_ids": prompt, "sampling_params": {"temperature": 0, "seed": 1,
                                                                        **sampling}}])


@pytest.fixture
def front():
    f = FakeFront(step_s=0.002)
    yield f
    f.stop()


def test_the_greeting_describes_the_engine_and_a_stranger_is_turned_away(front):
    front.kv_tokens = 4096
    client = Client(front)
    assert client.greeting == {"protocol": PROTOCOL, "model": "fake-front", "max_model_len": 8192,
                               "max_num_seqs": None, "kv_tokens": 4096, "engine": "stand-in"}
    info = FrontClient(front.url).info()
    assert (info.model, info.max_model_len, info.kv_tokens) == ("fake-front", 8192, 4096)
    other = Client(front, hello={"hello": PROTOCOL + 1})
    assert "this front speaks protocol" in other.greeting["error"]
    with pytest.raises(EOFError):
        other.line()


def test_every_iteration_comes_in_one_line_and_the_tokens_are_the_engines(front):
    client = Client(front)
    prompts = {"a": [4, 5, 6], "b": [7, 8], "c": [9]}
    for rid, prompt in prompts.items():
        add(client, rid, prompt, max_tokens=12)
    seen = client.until_done(set(prompts))
    for rid, prompt in prompts.items():
        assert [t for entry in seen[rid] for t in entry[1]] == expected_tokens(prompt, 12, 1)
        assert seen[rid][-1][2] == "length"
    # one line an iteration: the requests added together came in the same lines
    lines = [[e[0] for e in line] for line in zip(*(seen[rid] for rid in prompts), strict=False)]
    assert all(len(ids) == 3 for ids in lines)


def test_a_batch_requests_tokens_come_in_chunks_the_first_and_last_at_once(front):
    client = Client(front)
    add(client, "b", [1, 2, 3], max_tokens=11, stream_interval=4)
    (entries,) = client.until_done({"b"}).values()
    assert [len(e[1]) for e in entries] == [1, 4, 4, 2]
    assert [t for e in entries for t in e[1]] == expected_tokens([1, 2, 3], 11, 1)


def test_an_abort_ends_the_request_in_the_engine_and_its_news(front):
    client = Client(front)
    add(client, "a", [4, 5], max_tokens=500)
    add(client, "b", [6, 7], max_tokens=5)
    first = client.line()
    client.send(["abort", "a"])
    seen = client.until_done({"b"})  # (a's news sent before the abort arrived comes first, if any did)
    assert front.aborted == 1
    client.sock.settimeout(0.1)
    with pytest.raises(TimeoutError):  # nothing more comes for the aborted request
        client.line()
    news_of_a = [entry for entry in first if entry[0] == "a"] + seen.get("a", [])
    assert seen["b"][-1][2] == "length"
    assert news_of_a and all(entry[2] is None and entry[4] is None for entry in news_of_a)  # never ended


def test_a_connection_that_closes_aborts_its_requests_and_no_other(front):
    leaving, staying = Client(front), Client(front)
    for rid in ("1", "2"):  # the same ids on both connections: each its own
        add(leaving, rid, [4, 5], max_tokens=500)
        add(staying, rid, [4, 5], max_tokens=30)
    leaving.line()
    leaving.close()
    deadline = time.time() + 5
    while front.aborted < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert front.aborted == 2
    seen = staying.until_done({"1", "2"})
    assert all(sum(len(e[1]) for e in entries) == 30 for entries in seen.values())


def test_a_refused_request_gets_its_error_and_the_connection_goes_on(front):
    front.context = 64
    client = Client(front)
    add(client, "long", list(range(1, 60)), max_tokens=10)
    client.send(["add", "bad", {"token_ids": [], "sampling_params": {}}])
    add(client, "ok", [1, 2], max_tokens=3)
    seen = client.until_done({"long", "bad", "ok"})
    assert "maximum context length is 64 tokens" in seen["long"][0][4]
    assert seen["bad"][0][4] == "token_ids must be a non-empty list of token ids"
    assert seen["ok"][-1][2] == "length"


def test_an_engine_that_fails_an_add_fails_that_request_alone(front, monkeypatch):
    client = Client(front)
    from tests.support.fake_front import FakeCore

    real_add = FakeCore.add

    async def flaky_add(self, key, token_ids, sampling):
        if sampling.get("seed") == 666:
            raise RuntimeError("out of something")
        await real_add(self, key, token_ids, sampling)

    monkeypatch.setattr(FakeCore, "add", flaky_add)
    add(client, "x", [1, 2], max_tokens=3, seed=666)
    add(client, "y", [1, 2], max_tokens=3)
    seen = client.until_done({"x", "y"})
    assert seen["x"][0][4] == "the front failed: out of something"
    assert seen["y"][-1][2] == "length"


def test_a_line_that_is_not_the_protocol_closes_the_connection_with_its_reason(front):
    client = Client(front)
    client.sock.sendall(b"not json\n")
    assert client.line() == {"error": "a line that is not JSON"}
    with pytest.raises(EOFError):
        client.line()


def test_a_daemon_that_stops_reading_is_dropped_and_its_requests_aborted(front):
    """News a connection leaves unread past the front's bound (a daemon stopped or stuck) does not pile
    up in the front: the connection is dropped and its requests are aborted in the engine."""
    front._server.max_unread = 4096
    front.step_s = 0.0  # iterations as fast as the loop goes: the kernel's socket buffers fill in moments
    client = Client(front)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for i in range(64):  # some 13 MB of news in all: more than the kernel's socket buffers hold
        add(client, str(i), [4, 5], max_tokens=8000, ignore_eos=True)
    counts = front._server.counts

    def settled() -> bool:
        """Dropped, and every request the engine took for it aborted but those that ran to their end
        before the drop (on a slow machine a few reach their 8,000 tokens first); adds still queued when
        it was dropped are never made: the engine may have taken fewer than 64."""
        finished = sum(counts.ended.values())
        return counts.dropped == 1 and front.aborted > 0 and front.aborted + finished == counts.added

    deadline = time.time() + 20
    while not settled() and time.time() < deadline:
        time.sleep(0.05)
    assert settled(), (counts, front.aborted)
    assert front._server.in_flight == 0
    other = Client(front)  # the front serves on
    add(other, "ok", [1, 2], max_tokens=3)
    assert other.until_done({"ok"})["ok"][-1][2] == "length"


def test_a_line_without_an_end_past_the_bound_closes_the_connection(front, monkeypatch):
    from fsched.core.runners import vllm_front

    monkeypatch.setattr(vllm_front, "MAX_LINE", 1 << 16)
    client = Client(front)
    client.sock.sendall(b"[" * (1 << 17))
    assert client.line() == {"error": f"a line over {1 << 16} bytes"}


def test_an_engine_that_fails_ends_the_front():
    """The engine core's failure is the front's: `wait` raises it (the program ends, the daemons see
    their connections close and wait for the engine to come back)."""
    import asyncio

    from fsched.core.runners.vllm_front import FrontServer

    class DeadCore:
        def info(self) -> dict:
            return {}

        async def news(self):
            raise RuntimeError("the engine core died")

    async def main() -> None:
        server = FrontServer(DeadCore())
        await server.start("127.0.0.1", 0)
        try:
            with pytest.raises(RuntimeError, match="the engine core died"):
                await asyncio.wait_for(server.wait(), 5)
        finally:
            await server.stop()

    asyncio.run(main())


def test_sigterm_stops_the_front_and_lets_it_shut_its_engine_down(tmp_path):
    """`until_stopped` (what the front's program serves under) returns on SIGTERM, so the program goes on
    to shut its engine core down (vLLM's processes would otherwise outlive it); the signal is caught from
    before the front announces its port."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "front.py"
    script.write_text(
        "import asyncio\n"
        "from fsched.core.runners.vllm_front import FrontServer, stop_on_signals, until_stopped\n"
        "from tests.integration.test_vllm_front import IdleCore\n"
        "async def main():\n"
        "    stop = stop_on_signals()\n"
        "    front = FrontServer(IdleCore())\n"
        "    print(await front.start('127.0.0.1', 0), flush=True)\n"
        "    await until_stopped(front, stop)\n"
        "    print('engine shut down', flush=True)\n"
        "asyncio.run(main())\n")
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=repo,
                            env={**os.environ, "PYTHONPATH": repo})
    port = int(proc.stdout.readline())
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # serving
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "engine shut down"


class IdleCore:
    """An engine with nothing to say."""

    def info(self) -> dict:
        return {}

    async def news(self):
        import asyncio

        await asyncio.Event().wait()


def test_an_id_in_use_is_refused_and_the_running_request_goes_on(front):
    client = Client(front)
    add(client, "a", [4, 5], max_tokens=30)
    add(client, "a", [6, 7], max_tokens=30)
    entries = []
    while not entries or entries[-1][2] is None:  # until the running request ends
        entries += [e for e in client.line() if e[0] == "a"]
    errors = [e[4] for e in entries if e[4] is not None]
    assert errors == ["request id a is in use on this connection"]
    tokens = [t for e in entries for t in e[1]]  # (no stop tokens asked: it runs past the stand-in's EOS)
    assert len(tokens) == 30 and tokens[: len(expected := expected_tokens([4, 5], 30, 1))] == expected
    assert entries[-1][2] == "length"


def test_a_connection_lost_on_a_send_ends_its_streams_at_the_next_poll(front):
    """The daemon's side: a send that finds the connection gone (the front went between two reads) ends
    every open stream as unavailable, reported by the next poll, so each is opened again."""
    from fsched.core.runners.front_link import FrontClient
    from fsched.core.runners.streams import Fault

    streams = FrontClient(front.url).streams()
    body = {"token_ids": [4, 5], "sampling_params": {"max_tokens": 500, "temperature": 0}}
    first = streams.open(body)
    real = streams._sock

    class Broken:
        def fileno(self):
            return real.fileno()

        def send(self, data):
            raise BrokenPipeError("the front went")

        def close(self):
            real.close()

    streams._sock = Broken()
    second = streams.open(body)
    news = streams.poll(0.0)
    assert {id(s) for s in news} == {id(first), id(second)}
    assert all(s.ended and s.fault is Fault.UNAVAILABLE for s in (first, second))
    assert len(streams) == 0 and streams.poll(0.0) == []


def scrape(port: int, request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") -> tuple[str, bytes]:
    """One request to the front's metrics port: the status line and the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), body


def samples(body: bytes) -> dict[tuple[str, frozenset], float]:
    """Prometheus' own parser's reading of a scrape: each sample's value by its name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def test_metrics_count_what_the_front_did_and_give_the_engines_figures_under_vllms_names(front):
    """/metrics: the front's own counts (added, refused, aborted, ended by reason, tokens sent, daemons
    and requests now) and each engine core's figures under vLLM's names and labels (an engine label for
    each of data parallelism's cores), in Prometheus' text format as its own parser reads it."""
    port = front.serve_metrics()
    front.engine_figures = {0: {"kv_cache_usage": 0.25, "waiting": 3, "prefix_cache_hits": 7,
                                "finished": {"length": 2, "abort": 1}},
                            1: {"running": 5, "finished": {"stop": 4}}}  # a second engine core: data parallel
    client = Client(front)
    add(client, "a", [1, 2, 3], max_tokens=3)
    add(client, "b", [4, 5], max_tokens=2)
    add(client, "too-long", [1] * 8000, max_tokens=500)
    assert set(client.until_done({"a", "b", "too-long"})) == {"a", "b", "too-long"}
    add(client, "c", [6], max_tokens=5000)
    client.line()  # c is running
    client.send(["abort", "c"])
    deadline = time.monotonic() + 5
    while front.aborted < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    status, body = scrape(port)
    assert status == "HTTP/1.1 200 OK"
    got = samples(body)
    engine = frozenset({"model_name": "fake-front", "engine": "0"}.items())
    assert got[("fsched_front_requests_added_total", frozenset())] == 3
    assert got[("fsched_front_requests_refused_total", frozenset())] == 1
    assert got[("fsched_front_requests_aborted_total", frozenset())] == 1
    assert got[("fsched_front_requests_ended_total", frozenset({("reason", "length")}))] == 2
    assert got[("fsched_front_tokens_total", frozenset())] == front.tokens_sent >= 6
    assert got[("fsched_front_daemons", frozenset())] == 1
    assert got[("fsched_front_requests", frozenset())] == 0
    assert got[("vllm:kv_cache_usage_perc", engine)] == 0.25
    assert got[("vllm:num_requests_waiting", engine)] == 3
    assert got[("vllm:num_requests_running", engine)] == 0
    assert got[("vllm:prefix_cache_hits_total", engine)] == 7
    assert got[("vllm:generation_tokens_total", engine)] == front.tokens_sent
    assert got[("vllm:request_success_total", engine | {("finished_reason", "length")})] == 2
    assert got[("vllm:request_success_total", engine | {("finished_reason", "abort")})] == 1
    second = frozenset({"model_name": "fake-front", "engine": "1"}.items())
    assert got[("vllm:num_requests_running", second)] == 5
    assert got[("vllm:generation_tokens_total", second)] == 0
    assert got[("vllm:request_success_total", second | {("finished_reason", "stop")})] == 4
    client.close()
    deadline = time.monotonic() + 5
    while samples(scrape(port)[1])[("fsched_front_daemons", frozenset())] != 0:
        assert time.monotonic() < deadline, "the closed connection is still counted"
        time.sleep(0.01)


def test_the_metrics_port_answers_health_and_refuses_what_it_does_not_serve():
    """/health says ok; another path is a 404, another method a 405, a line that is not HTTP a 400, a
    HEAD the headers alone; a client that sends nothing is cut off after the timeout; a model's name
    with quotes and backslashes stays itself through the labels."""
    front = FakeFront(model='we"ird\\name')
    try:
        port = front.serve_metrics(timeout_s=0.3)
        assert scrape(port, b"GET /health HTTP/1.1\r\n\r\n") == ("HTTP/1.1 200 OK", b"ok\n")
        assert scrape(port, b"GET /nope HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 404 Not Found"
        assert scrape(port, b"POST /metrics HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 405 Method Not Allowed"
        assert scrape(port, b"hello\r\n\r\n")[0] == "HTTP/1.1 400 Bad Request"
        # answered whole though the client still sends: its body, a head past the bound
        big_post = b"POST /metrics HTTP/1.1\r\nContent-Length: 200000\r\n\r\n" + b"x" * 200_000
        assert scrape(port, big_post)[0] == "HTTP/1.1 405 Method Not Allowed"
        assert scrape(port, b"A" * 40_000)[0] == "HTTP/1.1 431 Request Header Fields Too Large"
        assert scrape(port, b"HEAD /metrics HTTP/1.1\r\n\r\n") == ("HTTP/1.1 200 OK", b"")
        got = samples(scrape(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")[1])
        labels = frozenset({"model_name": 'we"ird\\name', "engine": "0"}.items())
        assert got[("vllm:num_requests_running", labels)] == 0
        with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
            began = time.monotonic()
            assert silent.recv(100) == b""
            assert time.monotonic() - began < 3
    finally:
        front.stop()


def test_the_metrics_port_holds_a_bounded_number_of_connections(front):
    """Past `max_connections` open at once, a new connection is answered 503 and closed at once (idle
    ones would otherwise hold the front's file descriptors for their timeout); once some close, scrapes
    are answered again."""
    port = front.serve_metrics(timeout_s=30, max_connections=3)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    time.sleep(0.2)  # accepted
    assert scrape(port)[0] == "HTTP/1.1 503 Service Unavailable"
    for sock in idle:
        sock.close()
    deadline = time.monotonic() + 5
    while (status := scrape(port)[0]) != "HTTP/1.1 200 OK":
        assert time.monotonic() < deadline, status
        time.sleep(0.02)

