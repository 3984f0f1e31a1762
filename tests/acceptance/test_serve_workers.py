"""`fsched serve --workers 2`: two server processes on one port, each with its own /metrics; a worker
killed is replaced, and a stop ends them all. The real command in a subprocess, a stand-in daemon."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(180)

CHAT = {"model": "standin", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8,
        "stream": True}


@pytest.fixture
def server(tmp_path) -> Server:
    s = make_server(tmp_path)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    s.start_daemon("--model", "standin:2ms")
    s.start_server("--workers", "2")
    s.wait_ready()
    yield s
    s.stop()


def _workers(supervisor: int) -> set[int]:
    """The supervisor's child processes, from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == supervisor:
            found.add(int(stat.parent.name))
    return found


def _streamed_chat(server: Server, key: str) -> str:
    """One streamed chat on a connection of its own; its last event."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, f"{r.text}\n{server.described()}"
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    return events[-1]


def _both_serving(server: Server, timeout: float = 60) -> None:
    """Both workers have started: each one's own metrics port answers."""
    deadline = time.monotonic() + timeout
    for worker in (0, 1):
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{server.metrics_port + worker}/metrics", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, f"worker {worker} did not start"
                time.sleep(0.1)


def _served(server: Server, worker: int) -> int:
    """The requests worker `worker` answered, by its own /metrics (its end-to-end latency histogram)."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port + worker}/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("fsched:e2e_request_latency_seconds_count")))


def test_two_workers_share_the_port_each_with_its_own_metrics(server):
    key = server.key("alice", "realtime")
    sent = 0
    with ThreadPoolExecutor(8) as pool:
        for _ in range(10):  # rounds of 8 at once until both have answered some (each accepts when idle)
            assert list(pool.map(lambda _: _streamed_chat(server, key), range(8))) == ["data: [DONE]"] * 8
            sent += 8
            served = [_served(server, w) for w in (0, 1)]
            if all(served) and sum(served) == sent:
                break
    assert sum(served) == sent and all(served), served  # every request answered once, by one of the two


def test_a_killed_worker_is_replaced_and_a_stop_ends_them_all(server):
    key = server.key("bob", "realtime")
    supervisor = server.procs[-1]
    _both_serving(server)  # one killed while it starts would count as a worker that cannot start
    first = _workers(supervisor.pid)
    assert len(first) == 2
    killed = min(first)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not (len(now := _workers(supervisor.pid)) == 2 and killed not in now):
        assert time.monotonic() < deadline, now
        time.sleep(0.1)
    assert [_streamed_chat(server, key) for _ in range(4)] == ["data: [DONE]"] * 4

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    assert not _workers(supervisor.pid)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health", timeout=2)
