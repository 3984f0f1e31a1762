"""The paced stand-in engine: its tokens are the fake engine's, its batch holds `slots`, its pace is kept."""

from __future__ import annotations

import json
import socket
import time

from tests.support import ideal_client
from tests.support.fake_engine import expected_tokens
from tests.support.paced_engine import PacedEngine


def _body(prompt: list[int], max_tokens: int, **extra) -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "return_token_ids": True, "seed": 3, **extra}


def test_tokens_are_the_fake_engines_and_the_batch_holds_the_slots():
    with PacedEngine(slots=2, step_s=0.01) as engine:
        bodies = [_body([5, 6, i], 6, ignore_eos=True) for i in range(1, 7)]
        run = ideal_client.run(engine.url, bodies, concurrency=6)
        assert engine.max_running == 2
    for body, tokens in zip(bodies, run.tokens, strict=True):
        assert len(tokens) == 6
        expected = expected_tokens(body["prompt"], 6, 3)  # up to an EOS, which ignore_eos runs past
        assert tokens[: len(expected)] == expected
    # 6 requests in 3 waves of 2, 6 iterations each: at least 18 iterations of 10 ms
    assert run.wall_s >= 0.17


def test_eos_and_max_tokens_end_a_stream_as_the_fake_engine_does():
    with PacedEngine(slots=64, step_s=0.002) as engine:
        bodies = [_body([9, i], 40) for i in range(40)]
        run = ideal_client.run(engine.url, bodies, concurrency=40)
    for body, tokens in zip(bodies, run.tokens, strict=True):
        assert tokens == expected_tokens(body["prompt"], 40, 3)


def test_a_stream_keeps_its_pace():
    step = 0.02
    with PacedEngine(slots=8, step_s=step) as engine:
        run = ideal_client.run(engine.url, [_body([1, i], 10, ignore_eos=True) for i in range(8)], 8)
        late = engine.late_ticks
    assert 10 * step * 0.9 <= run.wall_s <= 10 * step + 0.5
    assert late == 0


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            more = sock.recv(65536)
            if not more:
                break
            data += more
    return data


def test_streamed_chat_sends_a_role_then_content_then_done():
    with PacedEngine(slots=4, step_s=0.002) as engine:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi there"}],
                           "max_tokens": 3, "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}}).encode()
        data = _raw(engine.url, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
    events = [json.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: {")]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    contents = [e["choices"][0]["delta"]["content"] for e in events[1:] if e["choices"]]
    assert len(contents) == 3 and all(c.startswith(" w") for c in contents)
    assert events[-1]["usage"]["completion_tokens"] == 3
    assert b"data: [DONE]" in data


def test_a_stream_interval_sends_the_first_token_alone_then_that_many_a_chunk():
    with PacedEngine(slots=4, step_s=0.002) as engine:
        body = json.dumps(_body([5, 6], 10, ignore_eos=True, stream_interval=4)).encode()
        data = _raw(engine.url, b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
    events = [line for line in data.split(b"\n") if line.startswith(b"data: {")]
    choices = [json.loads(line[6:])["choices"][0] for line in events]
    assert [len(c["token_ids"]) for c in choices] == [1, 4, 4, 1]  # the last chunk at once: the end
    tokens = [t for c in choices for t in c["token_ids"]]
    assert "".join(c["text"] for c in choices) == "".join(f" w{t}" for t in tokens)
    expected = expected_tokens([5, 6], 10, 3)
    assert tokens[: len(expected)] == expected
    assert [c["finish_reason"] for c in choices] == [None, None, None, "length"]


def test_a_client_that_leaves_frees_its_slot():
    with PacedEngine(slots=1, step_s=0.005) as engine:
        host, port = engine.url.removeprefix("http://").split(":")
        body = json.dumps(_body([1], 1000)).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.recv(100)
        sock.close()
        deadline = time.monotonic() + 2
        while engine.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        run = ideal_client.run(engine.url, [_body([2], 3, ignore_eos=True)], 1)
        assert engine.aborted == 1
    assert len(run.tokens[0]) == 3


def test_through_the_front_its_iterations_hold_the_same_tokens_and_slots():
    """With a front port the engine's iterations are served through fsched's vLLM front too: a daemon's
    runner reads there the tokens the HTTP streams carry, and the requests wait for the same slots."""
    from fsched.core.runners.front_link import FrontClient
    from fsched.core.runners.remote import Codec, RemoteRunner
    from fsched.core.runners.standin import STANDIN_EOS, standin_text
    from fsched.core.runners.tokens_api import front_api
    from fsched.core.sched.plan import Plan, PrefillChunk
    from fsched.core.sched.request import Request
    from fsched.core.types import SamplingParams

    with PacedEngine(slots=3, step_s=0.002, front_port=0) as engine:
        codec = Codec(standin_text, frozenset({STANDIN_EOS}), 8192)
        runner = RemoteRunner(FrontClient(engine.front_url), codec, "m", api=front_api(codec.eos_token_ids))
        requests = [Request.to_run(str(i), [9, i], SamplingParams(max_tokens=40, temperature=0, seed=3))
                    for i in range(6)]
        for r in requests:
            runner.add(r)
        runner.run(Plan(step=0, prefill=tuple(PrefillChunk(r.id, 0, 2, True) for r in requests)))
        running, step = {r.id for r in requests}, 1
        while running:
            running -= set(runner.run(Plan(step=step, decode=tuple(sorted(running)))).finished)
            step += 1
        assert engine.max_running == 3
        for r in requests:
            assert r.output == expected_tokens([9, int(r.id)], 40, 3)
