"""The real `fsched` executable: its entry point, a submit and status through it on a real SQLite file,
its help, and the live view until Ctrl-C (a terminal and a signal). Every command's logic and every bad
input are tested in process (tests/unit/test_cli_commands.py)."""

from __future__ import annotations

import json
import signal
import subprocess
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
    proc = subprocess.Popen(
        [FSCHED, "status", "--watch", "--interval", "0.2"],
        env=fsched.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(2)
    fsched.ok("cancel", "1")  # the live view picks the change up
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    text = out.decode()
    assert "queued" in text and "cancelled" in text and "Traceback" not in err.decode()


def test_help(fsched):
    assert "Usage" in fsched.ok("--help")
