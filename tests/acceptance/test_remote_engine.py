"""`fsched daemon --engine URL` as a user runs it, over the stand-in engine server.

The engine (tests/support/fake_engine.py) runs in this process on a loopback
port; the daemons are real `fsched daemon` subprocesses. Its greedy tokens are
the stand-in model's, so `--model standin --engine URL` must store exactly what
the built-in `--model standin` stores. 1 to 4 minutes in all on a 2-core machine,
depending on its load (3.6 min measured under heavy load). The engine serves both
interfaces: the daemon takes the token interface by itself (`--engine-api auto`),
and the preemption and kill -9 cases run over each interface by name, and over
fsched's vLLM front (its real server, over a stand-in engine core:
tests/support/fake_front.py), as do the engine's restart and its refusal.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from fsched.storage.jobstore import SqlJobStore
from tests.support.fake_engine import FakeEngine
from tests.support.fake_front import FakeFront

from .conftest import FSCHED, Fsched
from .test_daemon import counters_consistent, outputs, total_tokens, unfinished

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def fs(fs: Fsched) -> Fsched:
    """The table commands in process: the daemon and its engine are this file's subject."""
    fs.in_process = True
    return fs


@pytest.fixture
def fake(request):
    """The stand-in engine, or the front over a stand-in engine core where the test's `api` is front."""
    callspec = getattr(request.node, "callspec", None)
    front = callspec is not None and callspec.params.get("api") == "front"
    engine = FakeFront(step_s=0.002) if front else FakeEngine(step_s=0.002)
    yield engine
    engine.stop()


def greedy_jobs(path, n=40, seed=0, max_tokens=96) -> str:
    """n greedy requests, each with its seed (the stand-in's greedy tokens depend on it)."""
    rng = random.Random(seed)
    words = "the fair queue serves every tenant its share of tokens while realtime chat waits less".split()
    with open(path, "w") as out:
        for i in range(n):
            out.write(json.dumps({
                "custom_id": f"q{i}", "prompt": " ".join(rng.choices(words, k=rng.randint(3, 40))),
                "max_tokens": rng.randint(8, max_tokens), "temperature": 0, "seed": 1000 * seed + i,
            }) + "\n")
    return str(path)


def reference(fs: Fsched, tmp_path, *files: tuple[str, ...]) -> dict:
    """What the built-in stand-in runner stores for the same jobs, on a table of its own."""
    db = tmp_path / "ref" / "fsched.db"
    ref = Fsched(db, {**fs.env, "FSCHED_DB": f"sqlite:///{db}"}, in_process=True)
    for args in files:
        ref.ok("submit", *args)
    ref.ok("daemon", "--model", "standin", "--until-idle", "--quiet", timeout=120)
    return outputs(ref)


def daemon(fs: Fsched, fake: FakeEngine, *args: str, api: str = "auto") -> subprocess.Popen:
    return subprocess.Popen([FSCHED, "daemon", "--model", "standin", "--engine", fake.url, "--engine-api",
                             api, *args], env=fs.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


both_apis = pytest.mark.parametrize("api", ["completions", "tokens", "front"])


def resumed(fake: FakeEngine, prompts: int) -> int:
    """Streams that resumed a request (their prompt is longer than every first prompt)."""
    return max(0, len(fake.bodies) - prompts)


@both_apis
def test_outputs_equal_the_builtin_runner_even_with_preemptions(fs, tmp_path, fake, api):
    batch = greedy_jobs(tmp_path / "batch.jsonl", n=40)
    chat = greedy_jobs(tmp_path / "chat.jsonl", n=10, seed=1, max_tokens=16)
    expected = reference(fs, tmp_path, (batch,), (chat, "--class", "realtime"))
    fs.ok("submit", batch)
    fake.step_s = 0.01  # slow enough that the batch is full when the realtime work arrives
    d = daemon(fs, fake, "--max-batch", "4", "--until-idle", api=api)
    deadline = time.time() + 60
    while time.time() < deadline and total_tokens(fs) < 60:
        time.sleep(0.05)
    fs.ok("submit", chat, "--class", "realtime")  # arrives with the batch full: preempts
    deadline = time.time() + 60
    while time.time() < deadline and backlog(fs)[1][1] == 0:
        time.sleep(0.05)
    fake.step_s = 0.002  # the realtime work is generating, so it has preempted: the rest at any pace
    _, err = d.communicate(timeout=180)
    assert d.returncode == 0, err.decode()
    assert outputs(fs) == expected
    # At most the batch in flight, plus the preempted streams the engine has not yet seen go: one step
    # may preempt several (ten realtime requests arrive at once), and on a loaded machine the engine's
    # threads may see their clients leave only after the resumed streams have come in (CI saw 6).
    assert fake.max_in_flight <= 2 * 4
    assert resumed(fake, 50) > 0  # preempted requests resumed from prompt + generated
    assert set(fake.apis) == {api}
    # By default a batch request's stream asks for 8 tokens a chunk, a realtime one for single tokens
    # (greedy requests send their seed unchanged: the realtime file's are from 1000 on).
    assert all(b.get("stream_interval") == (None if b["seed"] >= 1000 else 8) for b in fake.bodies)
    counters_consistent(fs)


@both_apis
def test_kill_9_twice_resumes_and_outputs_are_identical(fs, tmp_path, fake, api):
    jobs = greedy_jobs(tmp_path / "job.jsonl", n=60)
    expected = reference(fs, tmp_path, (jobs,))
    fs.ok("submit", jobs)
    fake.step_s = 0.01
    for _ in range(2):
        before = total_tokens(fs)
        d = daemon(fs, fake, "--batch-stream-interval", "3", api=api)
        deadline = time.time() + 60
        while time.time() < deadline and total_tokens(fs) < before + 100:
            time.sleep(0.05)
        assert unfinished(fs) > 0  # killed mid-run
        d.send_signal(signal.SIGKILL)
        d.communicate(timeout=30)
        counters_consistent(fs)
    fake.step_s = 0.002
    fs.ok("daemon", "--model", "standin", "--engine", fake.url, "--engine-api", api, "--until-idle",
          "--quiet", timeout=120)
    assert outputs(fs) == expected
    assert set(fake.apis) == {api}
    assert {b.get("stream_interval") for b in fake.bodies} == {3, 8}  # the killed daemons', the last one's


@pytest.mark.parametrize("api", ["auto", "front"])
def test_engine_restart_mid_run_logs_once_and_loses_nothing(fs, tmp_path, fake, api):
    jobs = greedy_jobs(tmp_path / "job.jsonl", n=40)
    expected = reference(fs, tmp_path, (jobs,))
    fs.ok("submit", jobs)
    fake.step_s = 0.01
    d = daemon(fs, fake, "--until-idle")
    deadline = time.time() + 60
    while time.time() < deadline and total_tokens(fs) < 100:
        time.sleep(0.05)
    fake.restart(down_s=2.0)
    fake.step_s = 0.002
    _, err = d.communicate(timeout=180)
    assert d.returncode == 0, err.decode()
    # auto: the engine serves its token interface
    assert set(fake.apis) == {"front" if api == "front" else "tokens"}
    lines = err.decode().splitlines()
    assert sum("unavailable" in line for line in lines) == 1, lines
    assert sum("is back after" in line for line in lines) == 1, lines
    assert outputs(fs) == expected


@pytest.mark.parametrize("api", ["auto", "front"])
def test_a_request_the_engine_refuses_fails_alone_with_its_message(fs, tmp_path, fake, api):
    jobs = greedy_jobs(tmp_path / "job.jsonl", n=6)
    poison = json.loads(open(jobs).readline())["prompt"]
    from fsched.core.runners.standin import standin_encode

    fake.refuse = lambda body: "this engine refuses that prompt" \
        if body["prompt"] == standin_encode(poison) else None
    fs.ok("submit", jobs)
    fs.ok("daemon", "--model", "standin", "--engine", fake.url, "--until-idle", "--quiet", timeout=120)
    job = json.loads(fs.ok("status", "1", "--json"))["jobs"][0]
    assert (job["num_done"], job["num_failed"]) == (5, 1)
    (err,) = [json.loads(x) for x in fs.ok("results", "1", "--errors").splitlines()]
    assert err["custom_id"] == "q0"
    message = err["error"]["message"]
    said = "" if api == "front" else "HTTP 400: "  # the front passes the engine's message as it is
    assert f"the engine refused the request: {said}this engine refuses that prompt" in message


def test_the_engine_context_is_the_limit(fs, tmp_path, fake):
    fake.context = 64
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"custom_id": "long", "prompt": "word " * 70, "max_tokens": 5}) + "\n"
                    + json.dumps({"custom_id": "ok", "prompt": "a b c", "max_tokens": 5, "seed": 1}) + "\n")
    fs.ok("submit", str(path))
    fs.ok("daemon", "--model", "standin", "--engine", fake.url, "--until-idle", "--quiet", timeout=120)
    (err,) = [json.loads(x) for x in fs.ok("results", "1", "--errors").splitlines()]
    assert err["custom_id"] == "long" and "context holds 64" in err["error"]["message"]


def backlog(fs: Fsched) -> list[tuple[int, int]]:
    """(requests not done, output tokens stored) of job 1 and job 2."""
    import sqlite3

    conn = sqlite3.connect(fs.db_path)
    try:
        return conn.execute("SELECT num_requests - num_done - num_failed, num_output_tokens FROM jobs "
                            "ORDER BY id").fetchall()
    finally:
        conn.close()


def test_fairness_3_to_1_both_backlogged(fs, tmp_path, fake):
    """Tenants weighted 3 and 1, both backlogged: 75% +- 5% of the dominant resource goes to the first.

    Read from the daemon's own served-share figure (dominant resource, decayed) while both
    tenants still have more queued than the batch holds; the stored tokens over the same
    window must split the same way (equal request mixes)."""
    fs.ok("tenants", "add", "heavy", "--weight", "3")
    fs.ok("tenants", "add", "light", "--weight", "1")
    fs.ok("submit", greedy_jobs(tmp_path / "a.jsonl", n=900, seed=2, max_tokens=64), "-t", "heavy")
    fs.ok("submit", greedy_jobs(tmp_path / "b.jsonl", n=300, seed=3, max_tokens=64), "-t", "light")
    fake.step_s = 0.004
    d = daemon(fs, fake, "--max-batch", "8")
    # The daemon's heartbeat read from the table (what `fsched status` shows), not by a command a
    # second: a command's start-up (~1 s of CPU) would take the cores from the daemon measured.
    store = SqlJobStore(fs.env["FSCHED_DB"])
    try:
        shares, window = [], []
        deadline = time.time() + 60
        while time.time() < deadline and len(shares) < 6:
            time.sleep(1.0)
            (heavy_left, heavy_tokens), (light_left, light_tokens) = backlog(fs)
            if heavy_left <= 8 or light_left <= 8:
                break  # one side no longer backlogged
            beats = store.list_daemons()
            share = beats[0].stats.served_share if beats else {}
            if heavy_tokens + light_tokens > 1500 and "heavy" in share:  # past the warm-up
                shares.append(share["heavy"])
                window.append((heavy_tokens, light_tokens))
    finally:
        store.db.dispose()
        d.send_signal(signal.SIGTERM)
        d.communicate(timeout=30)
    print(f"heavy's served share {shares}; stored tokens over the window {window[0]} -> {window[-1]}")
    assert len(shares) >= 4, shares
    mean = sum(shares) / len(shares)
    assert 0.70 <= mean <= 0.80, shares
    heavy = window[-1][0] - window[0][0]
    light = window[-1][1] - window[0][1]
    assert 0.70 <= heavy / (heavy + light) <= 0.80, (heavy, light)
