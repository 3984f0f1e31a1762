"""Concurrency under load, with a daemon: 8 submitters of 5,000-line files, a canceller and a
reweighter, all real `fsched` processes, while `fsched daemon --model standin:1ms` claims,
flushes and finishes requests on the same SQLite file.

No command may show a user "database is locked" or a traceback: each exits 0 or with
one expected, clear line. Every acknowledged job is in the table whole, and the
counters add up. The same storm without a daemon (with --long), and the BEGIN IMMEDIATE
regression test, are tests/acceptance/test_concurrency.py and
tests/integration/test_sqlite_setup.py.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess

import pytest

from fsched.storage.jobstore import SqlJobStore

from .harness import FSCHED, Table, check_table, wait_for, write_job_file

SUBMITTERS = 8
LINES = 5_000
TENANTS = ("t0", "t1", "t2")


def _bash_loop(table: Table, body: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", body], env=table.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _no_lock_error(who: str, stderr: bytes) -> None:
    text = stderr.decode(errors="replace")
    assert "locked" not in text and "Traceback" not in text, f"{who}:\n{text}"


@pytest.mark.timeout(300)
def test_submits_cancels_and_weights_while_a_daemon_serves(tmp_path):
    table = Table.at(tmp_path / "state" / "fsched.db")
    store = SqlJobStore(table.url)
    for tenant in TENANTS:
        store.add_tenant(tenant)
    store.db.dispose()
    path = write_job_file(tmp_path / "big.jsonl", LINES, seed=1, max_tokens=(1, 6))
    # 1 ms a step: the daemon claims, flushes and finishes all the while, without
    # spinning a core of the two the submitters share.
    daemon = table.start("daemon", "--model", "standin:1ms", "--quiet")
    assert wait_for(lambda: _daemons(table) > 0, timeout=30), "the daemon never started"

    # Cancel jobs 1, 3, 5 and 7 as they appear (some exist, some not yet), and reweight throughout.
    # Then cancel job 1 again until it exists (up to 30 s): at least one cancel lands, however the
    # submits and the first pass interleave on a loaded machine.
    canceller = _bash_loop(table, f"for i in 1 3 5 7; do {FSCHED} cancel $i; done; "
                                  f"for t in $(seq 150); do {FSCHED} cancel 1 && break; sleep 0.2; done")
    weigher = _bash_loop(table, f"for w in $(seq 1 6); do {FSCHED} tenants set-weight t$((w % 3)) $w; done")
    submitters = [
        subprocess.Popen([FSCHED, "submit", str(path), "--tenant", TENANTS[i % 3], "--json"],
                         env=table.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(SUBMITTERS)
    ]
    submitted = [p.communicate(timeout=240) for p in submitters]
    cancel_out, cancel_err = canceller.communicate(timeout=240)
    _, weigh_err = weigher.communicate(timeout=240)
    # Let the daemon stop the cancelled jobs' running requests and serve a little more.
    wait_for(lambda: _done(table) > 200, timeout=10)
    daemon.send_signal(signal.SIGTERM)
    _, daemon_err = daemon.communicate(timeout=60)

    for proc, (_, err) in zip(submitters, submitted, strict=True):
        assert proc.returncode == 0, err.decode()
        _no_lock_error("submit", err)
    acknowledged = sorted(json.loads(out)["job_id"] for out, _ in submitted)
    assert len(set(acknowledged)) == SUBMITTERS
    assert all(json.loads(out)["num_requests"] == LINES for out, _ in submitted)

    assert weigher.returncode == 0, weigh_err.decode()
    _no_lock_error("set-weight", weigh_err)
    _no_lock_error("cancel", cancel_err)
    # The canceller's only expected complaint: a job id that does not exist (yet).
    for complaint in cancel_err.decode().splitlines():
        assert re.fullmatch(r"fsched: error: no job with id \d+", complaint), complaint
    assert daemon.returncode == 0, daemon_err.decode()
    _no_lock_error("daemon", daemon_err)

    snap = check_table(table.path)  # whole jobs, counters = rows, nothing cancelled left waiting
    conn = sqlite3.connect(table.path)
    try:
        jobs = conn.execute("SELECT id, state FROM jobs ORDER BY id").fetchall()
        ids = {job_id: {cid for (cid,) in conn.execute(
            "SELECT custom_id FROM requests WHERE job_id = ?", (job_id,))} for job_id, *_ in jobs}
        weights = dict(conn.execute("SELECT name, weight FROM tenants").fetchall())
    finally:
        conn.close()
    assert [j[0] for j in jobs] == acknowledged  # every acknowledged submit, nothing else
    custom_ids = {f"big-{i}" for i in range(LINES)}
    assert all(ids[job_id] == custom_ids for job_id in acknowledged)
    assert weights == {"t0": 6.0, "t1": 4.0, "t2": 5.0}  # every set-weight landed, the last one last
    cancelled = [j for j in jobs if j[1] == "cancelled"]
    assert cancelled, f"no job was cancelled: {cancel_out.decode()} {cancel_err.decode()}"
    assert snap.states.get("done", 0) > 0, "the daemon served nothing"
    print(f"load: {snap.summary()}; jobs cancelled: {[j[0] for j in cancelled]}")


def _daemons(table: Table) -> int:
    if not table.path.exists():
        return 0
    try:
        conn = sqlite3.connect(table.path, timeout=5)
        try:
            return conn.execute("SELECT COUNT(*) FROM daemons").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def _done(table: Table) -> int:
    conn = sqlite3.connect(table.path, timeout=30)
    try:
        return conn.execute("SELECT COUNT(*) FROM requests WHERE state = 'done'").fetchone()[0]
    finally:
        conn.close()
