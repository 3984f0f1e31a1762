"""RemoteRunner against the stand-in engine server: streams, preemption, faults, sampling.

Each test starts a FakeEngine on a loopback port (in this process) and runs the
real engine loop (scheduler + RemoteRunner) over it; about 5 s in all. The
cases that exercise the wire (what a stream asks, resumes, faults, refusals)
run over both engine interfaces: `/v1/completions` and the token interface.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

from fsched.core.daemon.engine import Engine
from fsched.core.runners.connect import engine_api
from fsched.core.runners.front_link import FrontClient
from fsched.core.runners.openai_http import EngineClient
from fsched.core.runners.remote import COMPLETIONS, Codec, RemoteRunner, completion_body, resume_seed
from fsched.core.runners.standin import STANDIN_EOS, StandInRunner, standin_text
from fsched.core.runners.tokens_api import front_api, tokens_api
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan, PrefillChunk
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, RequestStatus, SamplingParams
from tests.support.fake_engine import FakeEngine, expected_tokens
from tests.support.fake_front import FakeFront

pytestmark = pytest.mark.timeout(120)

CODEC = Codec(standin_text, frozenset({STANDIN_EOS}), 8192)
APIS = {"completions": COMPLETIONS, "tokens": tokens_api(CODEC.eos_token_ids),
        "front": front_api(CODEC.eos_token_ids)}
both_apis = pytest.mark.parametrize("api", ["completions", "tokens"])
# fsched's vLLM front (its real server over a stand-in engine core) as well
every_api = pytest.mark.parametrize("api", list(APIS))


@pytest.fixture
def fake(request):
    """The stand-in engine, or the front over a stand-in engine core where the test's `api` is front."""
    callspec = getattr(request.node, "callspec", None)
    front = callspec is not None and callspec.params.get("api") == "front"
    engine = FakeFront(step_s=0.001) if front else FakeEngine(step_s=0.001)
    yield engine
    engine.stop()


def remote_runner(fake: FakeEngine | FakeFront, api: str = "completions", **kw) -> RemoteRunner:
    client = FrontClient(fake.url) if api == "front" else EngineClient(fake.url)
    return RemoteRunner(client, CODEC, fake.model, api=APIS[api], **kw)


def config(**kw) -> SchedulerConfig:
    base = dict(max_batch=8, kv_tokens=4096, step_tokens=1024, host_kv_tokens=0, min_quantum_steps=2)
    return SchedulerConfig(**{**base, **kw})


def requests(n=24, temperature=0.0, seed0=0):
    return [Request.to_run(str(i), list(range(1, 4 + i % 7)), SamplingParams(
        max_tokens=10 + (i * 7) % 40, temperature=temperature, seed=seed0 + i)) for i in range(n)]


def run(runner, reqs, cfg=None, on_step=None):
    return Engine(runner, Scheduler(cfg or config(), "fsched", {}), 8192).run_all(reqs, on_step)


@every_api
def test_greedy_outputs_equal_the_builtin_standin(fake, api):
    remote = run(remote_runner(fake, api), requests())
    local = run(StandInRunner(), requests())
    assert set(remote) == set(local)
    for rid, result in local.items():
        assert remote[rid].tokens == result.tokens, rid
        assert remote[rid].status == result.status
        assert remote[rid].text == result.text
    assert fake.max_in_flight <= 8  # never more than the batch in flight
    assert fake.apis == [api] * len(fake.bodies) and all(b["stream"] for b in fake.bodies)
    if api == "completions":
        assert all(b["return_token_ids"] for b in fake.bodies)
    else:  # the token interface: nothing to detokenize, the end token named
        assert all(b["detokenize"] is False and STANDIN_EOS in b["stop_token_ids"] for b in fake.bodies)


def test_a_stream_leaves_the_engines_count_before_its_last_event_goes_out(fake):
    """What the batch bound above counts on: the stand-in engine frees a stream's place once its last token
    is made, as an engine frees a sequence, so a client that opens its next stream on reading that event
    never overlaps the two. (Counted until the stream's thread ended, the bound failed now and then: here
    that thread is held after its last event until the count is read.)"""
    released, send = threading.Event(), fake._send

    def send_then_hold(handler, made, finish, tokens_api):
        send(handler, made, finish, tokens_api)
        if finish is not None:
            released.wait(10)

    fake._send = send_then_hold
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3, "stream": True, "ignore_eos": True,
                       "temperature": 0}).encode()
    try:
        with socket.create_connection(("127.0.0.1", fake.port), timeout=10) as conn:
            head = b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
            conn.sendall(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            read = b""
            while b'"finish_reason": "length"' not in read:
                piece = conn.recv(65536)
                assert piece, f"the stream ended before its last event: {read!r}"
                read += piece
            assert fake.in_flight == 0 and fake.max_in_flight == 1
    finally:
        released.set()


def test_the_token_interface_is_chosen_where_the_engine_serves_it(fake):
    assert engine_api(EngineClient(fake.url), "auto", CODEC).name == "tokens"
    assert engine_api(EngineClient(fake.url), "completions", CODEC) is COMPLETIONS
    fake.token_interface = False  # an engine without it (404), as vLLM before the interface
    assert engine_api(EngineClient(fake.url), "auto", CODEC) is COMPLETIONS
    with pytest.raises(ValueError, match="--tokens-only"):
        engine_api(EngineClient(fake.url), "tokens", CODEC)


def test_a_step_reports_every_token_that_arrived_and_waits_when_none_did(fake):
    fake.step_s = 0.01
    runner = remote_runner(fake, max_wait_s=0.2)
    params = SamplingParams(max_tokens=30, temperature=0, seed=3)
    a = Request.to_run("a", [5, 6, 7], params)
    runner.add(a)
    sent = fake.tokens_sent
    first = runner.run(Plan(step=0, prefill=(PrefillChunk("a", 0, 3, True),)))
    assert first.outcome.produced["a"] >= 1  # waited for the first token
    # The engine runs ahead: the next step collects all it sent.
    deadline = time.monotonic() + 30
    while fake.tokens_sent - sent < first.outcome.produced["a"] + 2:
        assert time.monotonic() < deadline, "the engine sent no second token in 30 s"
        time.sleep(0.01)
    result = runner.run(Plan(step=1, decode=("a",)))
    assert result.outcome.produced["a"] > 1
    assert len(a.output) == first.outcome.produced["a"] + result.outcome.produced["a"]
    assert a.output == expected_tokens([5, 6, 7], 30, 3)[: len(a.output)]  # appended to the record
    # A slow engine: the step returns after max_wait_s with nothing, neither sooner nor when the
    # token comes (far later: a loaded machine's delays do not reach it).
    runner.release("a")
    fake.step_s = 30.0
    runner.add(Request.to_run("b", [1, 2], params))
    start = time.perf_counter()
    empty = runner.run(Plan(step=2, prefill=(PrefillChunk("b", 0, 2, True),)))
    took = time.perf_counter() - start
    runner.release("b")  # the engine sees its client go and stops waiting
    assert empty.outcome.produced.get("b", 0) == 0 and 0.19 <= took < 15


def test_a_readable_wake_descriptor_ends_a_steps_wait_at_once(fake):
    fake.step_s = 1.0  # no token comes for a second
    runner = remote_runner(fake, max_wait_s=2.0)
    wake_r, wake_w = socket.socketpair()
    try:
        runner.wake_on(wake_r.fileno())
        runner.add(Request.to_run("a", [1, 2], SamplingParams(max_tokens=5, temperature=0)))
        threading.Timer(0.1, wake_w.send, (b"x",)).start()
        start = time.perf_counter()
        result = runner.run(Plan(step=0, prefill=(PrefillChunk("a", 0, 2, True),)))
        took = time.perf_counter() - start
        # Nothing produced: ended before the token a second in (a wait for it would have taken it).
        assert result.outcome.produced.get("a", 0) == 0 and took >= 0.08
        wake_r.recv(16)  # its owner takes the wake-up: the next step waits for tokens again
        result = runner.run(Plan(step=1, decode=("a",)))
        assert result.outcome.produced["a"] >= 1
    finally:
        runner.release("a")
        wake_r.close()
        wake_w.close()


@every_api
def test_preemption_aborts_the_stream_and_resumes_from_prompt_plus_generated(fake, api):
    fake.step_s = 0.005
    runner = remote_runner(fake, api)
    params = SamplingParams(max_tokens=60, temperature=0, seed=11)
    a = Request.to_run("a", [9, 8, 7], params)
    runner.add(a)
    runner.run(Plan(step=0, prefill=(PrefillChunk("a", 0, 3, True),)))
    for step in range(1, 4):
        runner.run(Plan(step=step, decode=("a",)))
    from fsched.core.sched.plan import Preemption
    from fsched.core.sched.request import Checkpoint

    kept = list(a.output)
    assert 0 < len(kept) < 60
    runner.run(Plan(step=4, preempted=(Preemption("a", Checkpoint.RECOMPUTE, 3),)))
    assert a.output == kept and runner.kv_tokens == 0
    time.sleep(0.05)
    deadline = time.time() + 10
    while "a" not in runner.run(Plan(step=5, decode=("a",))).finished and time.time() < deadline:
        pass
    assert a.output == expected_tokens([9, 8, 7], 60, 11)
    assert fake.bodies[-1]["prompt"] == [9, 8, 7, *kept]  # the resume: prompt + generated ids
    assert fake.bodies[-1]["max_tokens"] == 60 - len(kept)
    assert runner.resumes == 1
    time.sleep(0.05)
    assert fake.aborted == 1  # the engine saw the disconnect and stopped the first stream


def run_with_late_realtime(runner, batch, late, cfg, every=3):
    """Run `batch`, adding a realtime request of `late` every `every` steps: each finds the batch full."""
    engine = Engine(runner, Scheduler(cfg, "fsched", {}), 8192)
    for r in batch:
        engine.add(r)
    results, step = {}, 0
    while engine.has_work or late:
        if late and step and step % every == 0:
            engine.add(late.pop(0))
        report = engine.step()
        step += 1
        for r in report.finished if report else []:
            results[r.id] = r
    return engine, results


def late_realtime(n=4):
    late = requests(n, seed0=100)
    for r in late:
        r.id, r.request_class = "rt-" + r.id, RequestClass.REALTIME
    return late


@every_api
def test_forced_preemptions_keep_greedy_outputs_exact(fake, api):
    fake.step_s = 0.002
    cfg = config(max_batch=4, preempt_grace_steps=0, min_quantum_steps=1)
    runner = remote_runner(fake, api)
    engine, remote = run_with_late_realtime(runner, requests(12), late_realtime(), cfg)
    local = run(StandInRunner(), requests(12) + late_realtime())
    assert engine.scheduler.preemptions > 0
    assert {k: v.tokens for k, v in remote.items()} == {k: v.tokens for k, v in local.items()}
    originals = {tuple(r.prompt) for r in requests(12) + late_realtime()}
    resumed = [b for b in fake.bodies if tuple(b["prompt"]) not in originals]
    assert runner.resumes == len(resumed) > 0


@both_apis
def test_batch_streams_come_in_chunks_and_keep_greedy_outputs_exact_through_preemptions(fake, api):
    """A batch request's stream asks for its tokens `batch_stream_interval` to a chunk; realtime ones each
    on its own. The realtime requests preempt the batch (whose tokens made but not sent are made again on
    resume) and every output is still the built-in stand-in's."""
    fake.step_s = 0.002
    cfg = config(max_batch=4, preempt_grace_steps=0, min_quantum_steps=1)
    runner = remote_runner(fake, api, batch_stream_interval=4)
    engine, remote = run_with_late_realtime(runner, requests(12), late_realtime(), cfg)
    local = run(StandInRunner(), requests(12) + late_realtime())
    assert engine.scheduler.preemptions > 0 and runner.resumes > 0
    assert {k: v.tokens for k, v in remote.items()} == {k: v.tokens for k, v in local.items()}
    for body in fake.bodies:  # the realtime requests' seeds are from 100 on (greedy: sent unchanged)
        assert body.get("stream_interval") == (None if body["seed"] >= 100 else 4), body
    assert max(fake.chunk_sizes) == 4 and 1 in fake.chunk_sizes


@both_apis
def test_an_engine_that_refuses_the_chunk_field_streams_single_tokens_and_fails_nothing(fake, api, caplog):
    fake.refuse = lambda body: "unknown field: stream_interval" if "stream_interval" in body else None
    runner = remote_runner(fake, api, batch_stream_interval=4)
    with caplog.at_level(logging.WARNING, logger="fsched.daemon"):
        remote = run(runner, requests(6))
    local = run(StandInRunner(), requests(6))
    assert {k: (v.status, v.tokens) for k, v in remote.items()} == {
        k: (v.status, v.tokens) for k, v in local.items()}
    # the refused streams are not recorded: every body the engine took asked for single tokens
    assert len(fake.bodies) == 6 and not any("stream_interval" in b for b in fake.bodies)
    assert sum("refuses stream_interval" in r.getMessage() for r in caplog.records) == 1
    assert runner.batch_stream_interval == 1


def test_a_chunked_stream_is_not_waited_for_by_the_gather(fake):
    """A step's gather waits for the streams that send every iteration; a chunked one sends every few,
    and waiting for it would hold each step's tokens to the gather's bound."""
    fake.step_s = 0.02
    runner = remote_runner(fake, batch_stream_interval=1000, gather_s=0.5)
    realtime = Request.to_run("rt", [5, 6, 7], SamplingParams(max_tokens=30, temperature=0),
                              request_class=RequestClass.REALTIME)
    batch = Request.to_run("b", [1, 2, 3], SamplingParams(max_tokens=30, temperature=0))
    for r in (realtime, batch):
        runner.add(r)
    runner.run(Plan(step=0, prefill=(PrefillChunk("rt", 0, 3, True), PrefillChunk("b", 0, 3, True))))
    steps = []
    for step in range(1, 6):
        started = time.perf_counter()
        runner.run(Plan(step=step, decode=("rt", "b")))
        steps.append(time.perf_counter() - started)
    assert len(batch.output) == 1  # its first token alone: the rest comes in one chunk at its end
    assert len(realtime.output) >= 5
    assert max(steps) < 0.25, steps  # never the gather's 0.5 s


@every_api
def test_engine_restart_mid_run_loses_nothing(fake, caplog, api):
    fake.step_s = 0.003
    runner = remote_runner(fake, api, backoff_s=(0.1, 0.4))
    crashed = []
    running = requests(12)

    def on_step(report):
        if not crashed and sum(len(r.output) for r in running if not r.status.is_finished) > 40:
            crashed.append(True)
            fake.restart(down_s=0.6)

    with caplog.at_level(logging.WARNING, logger="fsched.daemon"):
        remote = run(runner, running, on_step=on_step)
    local = run(StandInRunner(), requests(12))
    assert not [v.error for v in remote.values() if v.error]
    assert crashed and runner.outage.count == 1
    assert {k: v.tokens for k, v in remote.items()} == {k: v.tokens for k, v in local.items()}
    lines = [r.message for r in caplog.records]
    assert sum("unavailable" in m for m in lines) == 1 and sum("is back after" in m for m in lines) == 1


@every_api
def test_a_refused_request_fails_alone_with_the_engine_message(fake, api):
    fake.refuse = lambda body: "prompt too nasty" if body["prompt"] == [1, 2, 3, 4, 5] else None
    results = run(remote_runner(fake, api), requests(8))
    failed = {k for k, v in results.items() if v.status is RequestStatus.FINISHED_FAILED}
    assert failed == {"2"}  # the one with prompt [1, 2, 3, 4, 5]
    said = "" if api == "front" else "HTTP 400: "  # the front passes the engine's message as it is
    assert f"the engine refused the request: {said}prompt too nasty" == results["2"].error
    local = run(StandInRunner(), requests(8))
    assert all(results[k].tokens == local[k].tokens for k in local if k != "2")


@every_api
def test_context_too_long_is_refused_by_the_engine_with_its_message(fake, api):
    fake.context = 64
    reqs = [Request.to_run("long", list(range(1, 40)), SamplingParams(max_tokens=50, temperature=0, seed=1)),
            Request.to_run("ok", [1, 2, 3], SamplingParams(max_tokens=20, temperature=0, seed=1))]
    results = run(remote_runner(fake, api), reqs)
    assert results["ok"].status.succeeded
    assert results["long"].status is RequestStatus.FINISHED_FAILED
    assert "maximum context length is 64 tokens" in results["long"].error


@every_api
def test_seeded_sampling_is_reproducible_uninterrupted_and_per_interruption_point(fake, api):
    """What is reproducible: an uninterrupted seeded request (the engine's own seeded run), and
    an interrupted one given the same interruption points. What is not: an interrupted request
    does not continue as the uninterrupted run would (the engine's generator restarts)."""
    prompt, params = [4, 5, 6], SamplingParams(max_tokens=40, temperature=0.8, seed=123)
    whole = expected_tokens(prompt, 40, 123, temperature=0.8)
    assert completion_body("m", prompt, params, 0, 8192)["seed"] == 123

    def interrupted_at(k: int) -> list[int]:
        runner = remote_runner(fake, api)
        s = Request.to_run("s", prompt, params, resumed=whole[:k])  # a resume after k tokens
        runner.add(s)
        runner.run(Plan(step=0, prefill=(PrefillChunk("s", 0, 3 + k, True),)))
        while "s" not in runner.run(Plan(step=1, decode=("s",))).finished:
            pass
        return s.output

    fresh = interrupted_at(0)
    assert fresh == whole
    once, again = interrupted_at(10), interrupted_at(10)
    assert once == again and once[:10] == whole[:10]
    assert once != whole
    assert fake.bodies[-1]["seed"] == resume_seed(123, 10) != 123


def test_greedy_requests_keep_their_seed_on_resume():
    params = SamplingParams(max_tokens=10, temperature=0, seed=5)
    assert completion_body("m", [1, 2, 3], params, 4, 100)["seed"] == 5
    body = completion_body("m", [1] * 95, params, 4, 100)
    assert body["max_tokens"] == 5  # capped at the room the context leaves


def test_every_stream_is_read_in_the_callers_thread_and_none_is_left_open(fake):
    # Threads other tests left behind may end during the run: count only the threads it started,
    # but the fake engine's own (one per connection it serves).
    before = {t.ident for t in threading.enumerate()}

    def started() -> int:
        return sum(t.ident not in before and "process_request" not in t.name for t in threading.enumerate())

    runner = remote_runner(fake)
    peak = []
    run(runner, requests(12), on_step=lambda report: peak.append(started()))
    assert max(peak) == 0  # no thread per stream: one selector in the engine loop's thread
    assert len(runner._streams) == 0 and runner.streams_opened >= 12  # every socket closed at its end


def test_the_daemon_in_front_of_a_remote_engine_opens_every_new_stream_of_a_step(fake):
    """The engine composes its own iterations: no step of the daemon's ends its prefill at a realtime
    first token (that held each other request arriving with it back a step: docs/scheduling.md)."""
    from fsched.core.daemon.build import DaemonSettings, build_daemon

    class Weights:
        def tenant_weights(self) -> dict[str, float]:
            return {}

    daemon = build_daemon(DaemonSettings(model="standin", engine=fake.url, link="off"), Weights(),
                          exclusive=True)
    config = daemon.engine.scheduler.config
    assert not config.cut_prefill_for_first_token and config.host_kv_tokens == 0
    assert SchedulerConfig().cut_prefill_for_first_token  # an engine whose step fsched composes keeps it
