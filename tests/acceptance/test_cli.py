"""The real `fsched` executable: its entry point, a submit and status through it on a real SQLite file,
its help, and the live view until Ctrl-C (a terminal and a signal). Every command's logic and every bad
input are tested in process (tests/unit/test_cli_commands.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

from .conftest import FSCHED, SAMPLE_JOBS


def test_submit_sample_jobs_and_status(fsched):
    out = fsched.ok("submit", str(SAMPLE_JOBS / "summaries.jsonl"), "--tenant", "alice", "--class", "batch")
    assert "submitted job 1: 10 request(s), tenant alice (new tenant, weight 1), class batch" in out
    info = json.loads(
        fsched.ok(
            "submit", str(SAMPLE_JOBS / "chat.jsonl"), "--class", "realtime", "--priority", "1", "--json"
        )
    )
    assert info == {
        "job_id": 2,
        "num_requests": 8,
        "tenant": "tester",
        "class": "realtime",
        "priority": 1,
        "tenant_created": True,
    }
    fsched.ok("submit", str(SAMPLE_JOBS / "openai_batch.jsonl"), "-t", "alice", "--name", "oa")
    status = json.loads(fsched.ok("status", "--json"))
    assert set(status) == {"jobs", "tenants", "daemons", "online", "fairness_jain"}
    job = status["jobs"][0]
    for key in (
        "id",
        "tenant",
        "class",
        "priority",
        "state",
        "num_requests",
        "num_done",
        "num_failed",
        "num_cancelled",
        "submitted_at",
    ):
        assert key in job
    assert [(j["id"], j["state"], j["num_requests"]) for j in status["jobs"]] == [
        (1, "queued", 10),
        (2, "queued", 8),
        (3, "queued", 6),
    ]
    assert status["jobs"][2]["name"] == "oa"
    tenants = {t["name"]: t for t in status["tenants"]}
    assert tenants["alice"]["queued"] == 16 and tenants["alice"]["entitled_share"] == 0.5
    table = fsched.ok("status")
    assert "summaries.jsonl" in table and "Tenants" in table and "alice" in table
    one = json.loads(fsched.ok("status", "2", "--json"))
    assert [j["id"] for j in one["jobs"]] == [2]
    mine = json.loads(fsched.ok("status", "--tenant", "alice", "--json"))
    assert [j["id"] for j in mine["jobs"]] == [1, 3]


def test_status_watch_redraws_until_ctrl_c(fsched):
    fsched.ok("submit", str(SAMPLE_JOBS / "chat.jsonl"))
    # Drawn as to a terminal (rich's TTY_COMPATIBLE), so each redraw reaches the pipe as it
    # happens and the test waits for the frame it expects; tests/acceptance/test_terminal.py
    # checks the frames' layout in a real one.
    proc = subprocess.Popen(
        [FSCHED, "status", "--watch", "--interval", "0.2"],
        env={**fsched.env, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120", "LINES": "40"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    screen = _Reader(proc.stdout)
    assert screen.wait_for(b"queued", 60), screen.text()
    drawn = screen.size()
    fsched.ok("cancel", "1")  # the live view picks the change up
    assert screen.wait_for(b"cancelled", 60, after=drawn), screen.text()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


class _Reader:
    """A process's output read as it comes, so a test waits for what it expects to see."""

    def __init__(self, stream) -> None:
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            with self._lock:
                self._chunks.append(chunk)

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def size(self) -> int:
        with self._lock:
            return sum(map(len, self._chunks))

    def wait_for(self, needle: bytes, timeout: float, after: int = 0) -> bool:
        """Whether `needle` shows in the output past its first `after` bytes within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if needle in b"".join(self._chunks)[after:]:
                    return True
            time.sleep(0.05)
        return False


def test_help(fsched):
    assert "Usage" in fsched.ok("--help")


def test_vllm_front_hands_its_process_to_vllms_python_with_vllms_arguments(tmp_path):
    """`fsched vllm-front` runs the front's file by the python it is given, fsched's options first and
    vLLM's engine arguments after them as they were written; a python that is not there is a clear error."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho \"$$ $@\"\n")
    fake_python.chmod(0o755)
    proc = subprocess.Popen([FSCHED, "vllm-front", "--python", str(fake_python), "--port", "8311", "--",
                             "--model", "/models/m", "--max-num-seqs", "7"],
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    pid, script, *args = out.split()
    assert int(pid) == proc.pid  # the same process: a service manager's signals reach the front
    assert script.endswith("core/runners/vllm_front.py")
    assert args == ["--host", "127.0.0.1", "--port", "8311", "--model", "/models/m", "--max-num-seqs", "7"]
    metrics = ["--metrics-port", "9311", "--metrics-host", "0.0.0.0"]
    with_metrics = subprocess.run([FSCHED, "vllm-front", "--python", str(fake_python), *metrics, "--",
                                   "--model", "/models/m"], capture_output=True, text=True, timeout=60)
    assert with_metrics.stdout.split()[2:] == ["--host", "127.0.0.1", "--port", "8200", *metrics, "--model",
                                               "/models/m"]
    missing = subprocess.run([FSCHED, "vllm-front", "--python", str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and "give --python PATH of vLLM's environment" in missing.stderr
