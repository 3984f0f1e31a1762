"""Benchmark: submitting a 50,000-line file, and `fsched status --json` over 1,000,000 requests.

    .venv/bin/python bench/submit_status.py [--lines 50000] [--total 1000000]

Each figure is printed beside a baseline measured in the same run:
- submit: the whole `fsched submit` command (process start, validation,
  one transaction) against a bare sqlite3 `executemany` of the same rows
  with no validation and no SQLAlchemy;
- status: the whole `fsched status --json` command against `fsched --help`
  (the cost of starting Python and importing), and its queries against the
  one it would need without per-job counters (a GROUP BY over every request).
Goals: submit <= 10 s, status <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FSCHED = str(Path(sys.executable).parent / "fsched")
WORDS = ("the quick brown fox jumps over a lazy dog while seven tenants share one model and "
         "every request waits its turn in a fair queue").split()


def make_job_file(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for i in range(lines):
            prompt = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40))
            out.write(json.dumps({"custom_id": f"doc-{i}", "prompt": f"Summarise: {prompt}",
                                  "max_tokens": 64 + i % 64, "temperature": 0}) + "\n")


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def bare_insert_seconds(job_file: Path, folder: Path) -> float:
    """The floor: the same rows into a plain table with sqlite3, nothing checked."""
    db = sqlite3.connect(folder / "bare.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE requests (id INTEGER PRIMARY KEY, job_id INT, idx INT, custom_id TEXT, "
               "prompt TEXT, params TEXT, state TEXT)")
    start = time.perf_counter()
    rows = []
    for idx, raw in enumerate(job_file.read_bytes().splitlines()):
        obj = json.loads(raw)
        rows.append((1, idx, obj["custom_id"], obj["prompt"], json.dumps(obj), "queued"))
    with db:
        db.executemany("INSERT INTO requests (job_id, idx, custom_id, prompt, params, state) "
                       "VALUES (?, ?, ?, ?, ?, ?)", rows)
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def fill_to(total: int, job_file: Path, url: str) -> None:
    """Submit the same file as further jobs (in-process) until `total` requests are stored."""
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission
    from fsched.core.types import RequestClass
    from fsched.storage.sql_catalog import SqlCatalogStore

    store = SqlCatalogStore(url)
    parsed = parse_job_file(job_file.read_bytes(), str(job_file))
    stored = sum(j.counts.num_requests for j in store.list_jobs())
    tenants = ["alice", "bob", "carol", "dave"]
    while stored < total:
        n = len(store.list_jobs())
        store.submit([JobSubmission(parsed, tenants[n % 4], RequestClass.BATCH, 5, f"fill-{n}")])
        stored += len(parsed.requests)
        print(f"  filled {stored:,} / {total:,} requests", file=sys.stderr, flush=True)
    store.db.dispose()


def naive_status_seconds(db_path: Path) -> float:
    """What status costs without counters: count every request by job and state."""
    db = sqlite3.connect(db_path)
    start = time.perf_counter()
    db.execute("SELECT job_id, state, COUNT(*) FROM requests GROUP BY job_id, state").fetchall()
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def counter_query_seconds(url: str, repeat: int) -> float:
    """What status's queries cost in-process (jobs, tenants, daemons), median of `repeat`."""
    from fsched.storage.sql_catalog import SqlCatalogStore

    store = SqlCatalogStore(url)
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        store.list_jobs()
        store.list_tenants()
        store.list_daemons()
        runs.append(time.perf_counter() - start)
    store.db.dispose()
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--total", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        db_path = folder / "fsched.db"
        url = f"sqlite:///{db_path}"
        env = {**os.environ, "FSCHED_DB": url}
        job_file = folder / "big.jsonl"
        make_job_file(job_file, args.lines)
        size_mb = job_file.stat().st_size / 1e6

        startup = statistics.median(timed([FSCHED, "--help"], env) for _ in range(args.repeat))
        submit = timed([FSCHED, "submit", str(job_file), "--tenant", "alice", "--json"], env)
        bare = bare_insert_seconds(job_file, folder)
        print(f"submit {args.lines:,} lines ({size_mb:.1f} MB): {submit:.2f} s "
              f"(goal <= 10 s) | bare sqlite3 insert {bare:.2f} s | ratio {submit / bare:.1f}x")

        fill_to(args.total, job_file, url)
        status_runs = [timed([FSCHED, "status", "--json", "--all"], env) for _ in range(args.repeat)]
        status = statistics.median(status_runs)
        naive = naive_status_seconds(db_path)
        queries = counter_query_seconds(url, args.repeat)
        print(f"status --json over {args.total:,} requests: median {status:.3f} s of {args.repeat} "
              f"(min {min(status_runs):.3f}, max {max(status_runs):.3f}; goal <= 1 s)")
        print(f"  baseline fsched --help (process start + imports): {startup:.3f} s "
              f"-> status costs {status / startup:.2f}x a bare start")
        print(f"  status's own queries in-process: {queries * 1000:.1f} ms | baseline GROUP BY over all "
              f"requests (no counters): {naive * 1000:.0f} ms -> {naive / queries:.0f}x cheaper")


if __name__ == "__main__":
    main()
