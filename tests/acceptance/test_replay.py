"""`fsched replay` against a live fsched (serve + a daemon over the paced engine), one key per tenant:
every request of a small trace completes, in the classes `fsched simulate` gives the same requests (one
trace reader for both), at their trace lengths; a refused key is a clear error. The flags' own errors and
an unreachable URL are tested without a server (tests/unit/test_replay.py,
tests/integration/test_replay_engine.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from fsched.core.sim.trace import load_trace, parse_mix
from tests.support.paced_engine import PacedEngine

from .conftest import FSCHED
from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(90)

REQUESTS = 30
FLAGS = ("--tenants", "a=3,b=1", "--mix", "20/30/50", "--seed", "5", "--rate-scale", "2")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A paced engine (4 slots, 10 ms a step), fsched in front of it, tenants a=3 and b=1 with a key each."""
    root = tmp_path_factory.mktemp("replay")
    with PacedEngine(slots=4, step_s=0.01) as engine:
        server = make_server(root)
        server.seed({"a": 3, "b": 1}, [])
        keys = {t: server.key(t, "realtime") for t in ("a", "b")}
        server.start_daemon("--model", "standin", "--engine", engine.url)
        server.start_server()
        try:
            server.wait_ready()
            yield server, keys, engine
        finally:
            server.stop()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": 0.1 * i, "prompt_tokens": 5 + 7 * i % 40,
                                        "output_tokens": 3 + 5 * i % 17}) + "\n" for i in range(REQUESTS)))
    return path


def replay(server: Server, trace, keys: dict[str, str], *extra: str):
    return subprocess.run(
        [FSCHED, "replay", str(trace), "--url", server.url,
         *(f"--key={t}={k}" for t, k in keys.items()), *FLAGS, *extra],
        capture_output=True, text=True, env=server.env, timeout=45)


def test_every_request_of_the_trace_completes_as_simulate_classes_it(live, trace, tmp_path):
    server, keys, engine = live
    sent_before = engine.requests
    proc = replay(server, trace, keys, "--json", "--records", str(tmp_path / "requests.jsonl"))
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    measured = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [m["index"] for m in measured] == list(range(REQUESTS))
    assert all(m["sent_s"] < m["first_token_s"] <= m["finish_s"] and m["error"] is None for m in measured)
    assert (run["sent"], run["completed"], run["refused"], run["failed"]) == (REQUESTS, REQUESTS, 0, 0)
    assert run["short_outputs"] == 0 and run["prompt_error"] == 0.0  # the stand-in's /tokenize is exact
    assert "/tokenize" in run["prompt_sizing"] and "ignore_eos" in run["forcing"]
    expected = load_trace(trace, tenants=["a", "b"], mix=parse_mix("20/30/50"), rate_scale=2, seed=5)
    by_class = {c.value: sum(r.request_class == c for r in expected)
                for c in {r.request_class for r in expected}}
    assert {c: s["count"] for c, s in run["report"]["classes"].items()} == by_class
    per_tenant = {t: sum(s["count"] for s in v["classes"].values())
                  for t, v in run["report"]["tenants"].items()}
    assert per_tenant == {t: sum(r.tenant == t for r in expected) for t in ("a", "b")}
    tokens = sum(r.output_tokens for r in expected)
    assert run["report"]["throughput_tok_s"] * run["report"]["makespan_s"] == pytest.approx(tokens)
    assert engine.requests - sent_before >= REQUESTS  # the engine ran them (fsched may resume some twice)


def test_a_refused_key_is_one_clear_error_before_anything_is_sent(live, trace):
    server, keys, engine = live
    sent_before = engine.requests
    proc = replay(server, trace, {**keys, "b": "fsk-not-a-key"})
    assert proc.returncode == 1 and "refused tenant b's key (HTTP 401)" in proc.stderr, proc.stderr
    assert engine.requests == sent_before
