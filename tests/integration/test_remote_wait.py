"""How long the daemon's step waits for a remote engine that sends nothing (core/daemon/duties.py).

The real Daemon over the in-memory queue, a RemoteRunner over the stand-in
engine server (a loopback port), and a link whose wake descriptor is a real
socket pair. The engine's first token comes 30 s in: the streams are open
and silent. The daemon's timed duties are seconds apart, so a step that
waits until the next one is told apart from one that ends at a fixed 50 ms,
and from one that waits past new work or a cancel, by far more than a
loaded machine's delays.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fsched.core.daemon.engine import Engine
from fsched.core.daemon.link import Wants
from fsched.core.daemon.loop import Daemon, DaemonConfig
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.memory import MemoryQueueStore
from fsched.core.ports.records import JobSubmission
from fsched.core.runners.openai_http import EngineClient
from fsched.core.runners.remote import Codec, RemoteRunner
from fsched.core.runners.standin import STANDIN_EOS, STANDIN_NAME, standin_encode, standin_text
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, RequestStatus, SamplingParams
from tests.support.fake_engine import FakeEngine

pytestmark = pytest.mark.timeout(120)

DUTY_S = 4.0  # the sync interval and the heartbeat: the first duty comes this long after a pass
CODEC = Codec(standin_text, frozenset({STANDIN_EOS}), 8192)


class WakingLink:
    """A link with a real wake descriptor: `announce` makes it readable, as a server's message does."""

    address = "test:0"

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self.wants = Wants()
        self.lock = threading.Lock()

    @property
    def wake_fd(self) -> int:
        return self._r.fileno()

    def announce(self, claim: bool = False, sync: bool = False) -> None:
        with self.lock:
            self.wants.claim, self.wants.sync = self.wants.claim or claim, self.wants.sync or sync
            self._w.send(b"x")

    def take_wake(self) -> Wants:
        with self.lock:
            wants, self.wants = self.wants, Wants()
            try:
                while self._r.recv(64):
                    pass
            except BlockingIOError:
                pass
            return wants

    def asked(self) -> bool:
        return bool(self.wants)

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def watcher(self, job_id: int) -> None:
        return None

    def send(self, lines) -> None:
        pass

    def close(self) -> None:
        self._r.close()
        self._w.close()


def job(prompt: str) -> JobSubmission:
    line = f'{{"custom_id": "c0", "prompt": "{prompt}", "max_tokens": 8, "temperature": 0}}\n'
    return JobSubmission(parse_job_file(line.encode(), "job.jsonl"), "alice", RequestClass.STREAMING, 5,
                         "job")


@pytest.fixture
def rig():
    fake = FakeEngine(step_s=30.0)  # open streams that send nothing for 30 s
    store = MemoryQueueStore()
    link = WakingLink()
    runner = RemoteRunner(EngineClient(fake.url), CODEC, fake.model)
    config = SchedulerConfig(max_batch=8, kv_tokens=4096, step_tokens=1024, host_kv_tokens=0)
    engine = Engine(runner, Scheduler(config, "fsched", {}), 8192)
    daemon = Daemon(store, engine, lambda r: standin_encode(r.prompt_text, r.messages),
                    DaemonConfig(owner="d1", host="test", pid=0, device="fake", model=STANDIN_NAME,
                                 policy="fsched", sync_interval_s=DUTY_S, heartbeat_s=DUTY_S,
                                 batch_flush_s=DUTY_S, lease_s=3 * DUTY_S),
                    link=link)
    daemon.start()
    store.submit([job("w1 w2 w3")])
    yield daemon, store, link
    for request_id in list(engine.request_ids):
        engine.cancel(request_id)
    link.close()
    fake.stop()


def timed_pass(daemon: Daemon) -> float:
    start = time.perf_counter()
    daemon.step()
    return time.perf_counter() - start


def test_a_step_over_silent_streams_waits_until_the_next_duty(rig):
    daemon, store, link = rig
    # One pass: the sync claims the request, and its step opens its stream and waits. Not 50 ms (a
    # fixed bound): until the next sync and heartbeat, due DUTY_S after this pass's.
    took = timed_pass(daemon)
    assert daemon.engine.scheduler.running and daemon.figures.tokens == 0
    assert took > DUTY_S / 4
    assert took < DUTY_S + 10


def test_new_work_announced_ends_the_wait_at_once(rig):
    daemon, store, link = rig
    store.submit([job("w4 w5")])
    threading.Timer(0.5, link.announce, kwargs={"claim": True}).start()
    took = timed_pass(daemon)  # the sync claims the first job; its step waits, until the announcement
    assert 0.4 < took < DUTY_S / 2  # past the old 50 ms, and ended by the announcement, not by a duty
    assert len(daemon.held) == 2  # the announced work, claimed when the step ended


def test_a_cancel_ends_the_wait_at_once(rig):
    daemon, store, link = rig
    (request,) = store.requests()

    def cancel() -> None:
        store.cancel_job(request.job_id)
        link.announce(sync=True)  # what a server does for a cancel: ask for a sync

    threading.Timer(0.5, cancel).start()
    took = timed_pass(daemon)
    assert 0.4 < took < DUTY_S / 2
    assert store.request(request.id).status is not RequestStatus.FINISHED_CANCELLED
    assert timed_pass(daemon) < DUTY_S / 2  # the sync the server asked for, and nothing left to wait on
    assert store.request(request.id).status is RequestStatus.FINISHED_CANCELLED


def test_while_requests_wait_in_the_scheduler_a_step_waits_no_longer_than_before():
    """The scheduler's plan for requests it has not admitted depends on the clock (aging, a preemption
    a tenant's recovered precedence allows): while any wait after the plan, the step's wait is bounded
    by `decide_s` (the 50 ms a step waited before), whatever the daemon's next duty."""
    fake = FakeEngine(step_s=30.0)
    runner = RemoteRunner(EngineClient(fake.url), CODEC, fake.model)
    config = SchedulerConfig(max_batch=1, kv_tokens=4096, step_tokens=1024, host_kv_tokens=0)
    engine = Engine(runner, Scheduler(config, "fsched", {}), 8192)
    try:
        for rid in ("a", "b"):
            engine.add(Request.to_run(rid, [1, 2, 3], SamplingParams(max_tokens=8, temperature=0)))
        start = time.perf_counter()
        engine.step(wait_s=DUTY_S, decide_s=0.2)  # "a" runs, "b" waits for its slot
        assert time.perf_counter() - start < DUTY_S / 2
        engine.cancel("b")
        start = time.perf_counter()
        engine.step(wait_s=1.0, decide_s=0.2)  # nobody waits: the step waits out its bound
        assert time.perf_counter() - start > 0.6
    finally:
        for rid in list(engine.request_ids):
            engine.cancel(rid)
        fake.stop()
