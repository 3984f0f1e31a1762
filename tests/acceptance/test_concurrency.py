"""8 processes submit at once while others cancel and reweight: nothing is lost or locked."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from .conftest import FSCHED

SUBMITTERS = 8
LINES = 2_000


# The same storm with a daemon serving, and 5,000-line files, is tests/chaos/test_load.py (the quick
# suite's check that no command meets "database is locked" and every acknowledged job is whole).
@pytest.mark.long
def test_concurrent_submits_cancels_and_weights(fsched, tmp_path):
    job_file = tmp_path / "job.jsonl"
    job_file.write_text(
        "".join(json.dumps({"prompt": f"line {i}", "max_tokens": 8}) + "\n" for i in range(LINES))
    )
    fsched.ok("tenants", "add", "shared")
    # A second process cancels whatever ids exist and changes weights, all the while.
    meddler = subprocess.Popen(
        [
            "bash",
            "-c",
            f"for i in $(seq 1 {SUBMITTERS}); do "
            f"{FSCHED} cancel $i; {FSCHED} tenants set-weight shared $i; done",
        ],
        env=fsched.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    submitters = [
        subprocess.Popen(
            [FSCHED, "submit", str(job_file), "--tenant", f"t{i % 3}", "--json"],
            env=fsched.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(SUBMITTERS)
    ]
    results = [p.communicate(timeout=300) for p in submitters]
    _, meddler_err = meddler.communicate(timeout=300)

    for proc, (_out, err) in zip(submitters, results, strict=True):
        assert proc.returncode == 0, err.decode()
        assert b"locked" not in err
    assert b"locked" not in meddler_err, meddler_err.decode()
    # The meddler's only possible complaint: a job id that did not exist yet.
    for complaint in meddler_err.decode().splitlines():
        assert complaint.startswith("fsched: error: no job with id"), complaint

    acknowledged = sorted(json.loads(out)["job_id"] for out, _ in results)
    assert len(set(acknowledged)) == SUBMITTERS
    conn = sqlite3.connect(fsched.db_path)
    rows = conn.execute("SELECT id, num_requests, num_cancelled, state FROM jobs ORDER BY id").fetchall()
    assert [r[0] for r in rows] == acknowledged
    for job_id, num_requests, num_cancelled, state in rows:
        assert num_requests == LINES
        per_state = dict(
            conn.execute(
                "SELECT state, COUNT(*) FROM requests WHERE job_id = ? GROUP BY state", (job_id,)
            ).fetchall()
        )
        assert sum(per_state.values()) == LINES
        assert per_state.get("cancelled", 0) == num_cancelled
        assert state == ("cancelled" if num_cancelled else "queued")
    weight = conn.execute("SELECT weight FROM tenants WHERE name = 'shared'").fetchone()[0]
    assert weight == SUBMITTERS  # every set-weight landed, the last one last
    conn.close()
