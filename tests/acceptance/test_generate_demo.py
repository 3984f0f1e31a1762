"""`fsched generate` and `fsched demo` as a user runs them: real processes, signals, the tiny model."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import time

import pytest

from fsched.cli.demo import BATCH_REQUESTS

from .conftest import FSCHED, Fsched, fsched_at

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def served(tmp_path_factory, model_cache) -> Fsched:
    """`fsched` on a table of this module's own with a daemon serving it (alive in `fsched status`),
    stopped with SIGTERM at the end; each test reads its own job ids. One torch thread: the suite
    runs two workers on two cores."""
    fs = fsched_at(tmp_path_factory.mktemp("served"))
    fs.in_process = True  # status and results in process: `generate` and the daemon are the subject
    fs.env["XDG_CACHE_HOME"] = model_cache
    proc = subprocess.Popen([FSCHED, "daemon", "--threads", "1", "--quiet"], env=fs.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        daemons = json.loads(fs.ok("status", "--json"))["daemons"]
        if any(d["alive"] for d in daemons):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the daemon did not start")
    yield fs
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)


def generate(fs: Fsched, *args: str) -> subprocess.Popen:
    return subprocess.Popen([FSCHED, "generate", *args], env=fs.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def read_chunks(proc: subprocess.Popen, until: float, most: int | None = None) -> list[tuple[float, bytes]]:
    """stdout as it arrives: (time, bytes) per read, until EOF, `until` or `most` non-blank reads."""
    chunks = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.time() < until and (most is None or sum(bool(d.strip()) for _, d in chunks) < most):
        if not sel.select(timeout=0.5):
            continue
        data = os.read(proc.stdout.fileno(), 65536)
        if not data:
            break
        chunks.append((time.time(), data))
    return chunks


def job(fs: Fsched, job_id: int = 1) -> dict:
    return json.loads(fs.ok("status", str(job_id), "--json"))["jobs"][0]


def test_generate_stream_prints_text_as_it_comes_then_latency(served):
    fs = served
    proc = generate(fs, "The scheduler admits the next request when", "--stream", "--max-tokens", "96",
                    "--temperature", "0", "--tenant", "bob")
    chunks = read_chunks(proc, time.time() + 60)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    text = b"".join(data for _, data in chunks).decode()
    # The text arrived in pieces, spread over time, not all at the end.
    pieces = [data for _, data in chunks if data.strip()]
    assert len(pieces) >= 2, chunks
    assert chunks[-1][0] - chunks[0][0] > 0.05
    stats = re.search(r"first token ([\d,]+) ms, ([\d.,]+) tok/s, 96 tokens \(length\), job (\d+)\n",
                      err.decode())
    assert stats, err.decode()
    assert 0 < int(stats.group(1).replace(",", "")) < 30_000
    job_id = int(stats.group(3))
    assert job(fs, job_id)["state"] == "completed" and job(fs, job_id)["class"] == "realtime"
    (line,) = fs.ok("results", str(job_id)).splitlines()
    assert text == json.loads(line)["response"]["body"]["choices"][0]["text"] + "\n"

    # --json: one object with the same figures, for scripts.
    out = json.loads(fs.ok("generate", "Hello", "--json", "--max-tokens", "5", "--temperature", "0"))
    assert (out["job_id"], out["tokens"], out["finish_reason"], out["state"]) == (
        job_id + 1, 5, "length", "done")
    assert out["ttft_ms"] > 0 and out["text"] and out["class"] == "realtime"


def test_generate_ctrl_c_cancels_the_request(served):
    fs = served
    proc = generate(fs, "Tell a long story about queues", "--stream", "--max-tokens", "1500")
    first = read_chunks(proc, time.time() + 60, most=1)  # wait until it is being generated
    assert first, "no text arrived"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err.decode()
    cancelled = re.search(r"job (\d+) cancelled", err.decode())
    assert cancelled, err.decode()
    job_id = int(cancelled.group(1))
    deadline = time.time() + 5
    while job(fs, job_id)["state"] != "cancelled" and time.time() < deadline:
        time.sleep(0.2)
    assert job(fs, job_id)["state"] == "cancelled"
    assert job(fs, job_id)["num_output_tokens"] < 1500


def test_generate_without_a_daemon_warns_then_times_out_and_cancels(fs):
    proc = fs.run("generate", "Hi", "--timeout", "1.5")
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "no daemon is running" in err and err.count("no daemon is running") == 1
    assert "fsched: error: no answer within 1.5 s; job 1 cancelled" in err
    assert proc.stdout == b""
    assert job(fs)["state"] == "cancelled"


@pytest.mark.long  # the demo's parts (submit, daemon, generate, status) each have their own tests
@pytest.mark.timeout(300)
def test_demo_json_serves_both_tenants_and_the_realtime_chats(fs):
    # A tenth of the demo's work: ~10 s on an idle 2-core CPU, minutes when the CPU is shared.
    proc = fs.run("demo", "--json", "--size", "0.1", "--threads", "2", timeout=280)
    assert proc.returncode == 0, proc.stderr.decode()
    s = json.loads(proc.stdout)
    assert s["policy"] == "fsched"
    batch, realtime = s["classes"]["batch"], s["classes"]["realtime"]
    expected = sum(round(n * 0.1) for n in BATCH_REQUESTS.values())
    assert batch["requests"] == batch["done"] == expected
    assert realtime["requests"] == realtime["done"] == 8
    assert s["requests"] == expected + 8 and s["tokens"] == batch["tokens"] + realtime["tokens"] > 0
    # Realtime chats jump the batch backlog.
    assert 0 < realtime["ttft_p50_ms"] <= realtime["ttft_p99_ms"] < batch["ttft_p99_ms"]
    tenants = s["tenants"]
    assert tenants["alice"]["entitled_share"] == 0.75 and tenants["bob"]["entitled_share"] == 0.25
    assert tenants["alice"]["tokens"] + tenants["bob"]["tokens"] == s["tokens"]
    assert abs(tenants["alice"]["token_share"] + tenants["bob"]["token_share"] - 1) < 1e-3
    assert s["tok_s"] > 0 and s["serve_s"] > 0
    assert not fs.db_path.exists()  # the demo used its own, temporary job table
