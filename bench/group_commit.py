"""The HTTP server's group commit on PostgreSQL alone, two source trees alternately.

    .venv/bin/python bench/group_commit.py OLD_TREE NEW_TREE [--reps 4] [--groups 200] [--size 8]
        [--busy] [--refused] [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]

A tree is a folder of fsched's sources (`git archive REV | tar -x -C DIR`, or a
worktree). Each rep runs both trees in turn, the order flipped every rep, each
in a process of its own on a fresh database: `--groups` group commits
(`SqlCatalogStore.submit_each`) of `--size` one-request online jobs of one
tenant, each with an API key, one after the other. Each run prints the round
trips of a group commit (the queries and syncs its connection sent, from
libpq's trace, over 20 group commits before the timed ones), its wall time p50
and p90, the CPU time of the thread that ran it (mean), that of the
PostgreSQL process serving its connection (mean, from /proc: the server on
this machine), and the 1-minute load average at its start. `--busy`: another
thread of the process spins meanwhile,
as a busy event loop does, so every reply waits for the interpreter's turn.
`--refused`: one job of every group is another tenant's, over its queue
limit (the path of a 429). `--two`: a third arm, NEW_TREE with its one-query
attempt skipped (its two-round-trip path alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

RUN = r'''
import json, os, statistics, sys, threading, time
import psycopg
from psycopg import pq
from sqlalchemy import event
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission, QueueFull, SubmittedJob
from fsched.core.types import JobOrigin, RequestClass
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_keys import SqlKeyStore

url, groups, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
busy, refused = sys.argv[4] == "1", sys.argv[5] == "1"
if os.environ.get("GC_TWO"):  # the new tree's two-round-trip path alone (its one-query attempt skipped)
    import fsched.storage.sql_catalog as sc
    import fsched.storage.submit as sm
    def two(writer, submissions, limit, now, one_query=False):
        with writer.write() as tx:
            return sm._group_commit_decided(tx, submissions, sorted({s.tenant for s in submissions}), limit,
                                            now, sm._group_rows(submissions))
    sc.group_commit = two
store = SqlCatalogStore(url)
key, _ = SqlKeyStore(store.db).create_key("carol", RequestClass.REALTIME)
line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 64}}
specs = parse_job_file((json.dumps(line) + "\n").encode(), "online")
def job(tenant="carol"):
    key_id = key.id if tenant == "carol" else None
    return JobSubmission(specs, tenant, RequestClass.REALTIME, 5, "chat", JobOrigin.ONLINE, key_id)
from sqlalchemy import text
LIMIT = 10_000
store.submit([JobSubmission(specs, "full", RequestClass.BATCH, 5, "fill", JobOrigin.SUBMIT, None)])
with store.db.write() as conn:  # "full" at its limit: with --refused, its job in every group gets a 429
    conn.execute(text(f"UPDATE jobs SET num_requests = {LIMIT} WHERE tenant = 'full'"))
def commit():
    jobs = [job() for _ in range(size)]
    if refused:
        jobs[size // 2] = job("full")
    out = store.submit_each(jobs, LIMIT)
    assert sum(isinstance(o, QueueFull) for o in out) == int(refused), out
    return out
def finish():  # carol's jobs end (as a daemon ends them), out of the timing: her count stays small
    with store.db.write() as conn:
        conn.execute(text("UPDATE jobs SET state = 'completed', num_done = num_requests "
                          "WHERE tenant = 'carol'"))
for _ in range(5):
    commit()
    finish()
# round trips, from libpq's trace of every connection opened from now on
path = f"/tmp/gc-trace-{os.getpid()}"
trace = open(path, "w")
conns = []
def opened(dbapi_conn, _rec):
    conns.append(dbapi_conn.pgconn)
event.listen(store.db.engine, "connect", opened)
kept = getattr(store, "_group_writer", None)
if kept is not None:
    kept.close()
store.db.engine.dispose()  # every connection from now on a new one, traced
commit()
for c in conns:
    c.trace(trace.fileno())
    c.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
for _ in range(20):
    commit()
for c in conns:
    c.untrace()
trace.close()
finish()
sent = [l.split("\t") for l in open(path) if l.startswith("F\t")]
trips = sum(1 for f in sent if f[2].split()[0] in ("Sync", "Query")) / 20
os.unlink(path)
stop = False
def spin():
    while not stop:
        sum(range(200))
spinner = threading.Thread(target=spin, daemon=True)
if busy:
    spinner.start()
writer = store._group_writer  # its server process: the CPU PostgreSQL spent on the group commits
kept = getattr(writer, "_kept", None)
raw = kept.raw if kept is not None else writer._conn.connection.dbapi_connection
stat = f"/proc/{raw.info.backend_pid}/stat"
def server_cpu():
    fields = open(stat).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
server0 = server_cpu()
walls, cpus = [], []
for _ in range(groups):
    t0, c0 = time.perf_counter(), time.thread_time()
    commit()
    cpus.append(time.thread_time() - c0)
    walls.append(time.perf_counter() - t0)
    finish()
stop = True
server = server_cpu() - server0
walls.sort()
print(json.dumps({"trips": trips, "p50_ms": 1000 * walls[len(walls) // 2],
                  "p90_ms": 1000 * walls[int(len(walls) * 0.9)],
                  "cpu_us": 1e6 * statistics.mean(cpus), "server_us": 1e6 * server / groups}))
store.db.dispose()
'''


def one_run(tree: Path, args, folder: Path, two: bool = False) -> dict:
    package = folder / f"pkg-{uuid.uuid4().hex[:6]}"
    package.mkdir()
    (package / "fsched").symlink_to(tree.resolve())
    name = f"fsched_gc_{uuid.uuid4().hex[:10]}"
    admin = args.url.replace("postgresql+psycopg", "postgresql")
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = args.url.rsplit("/", 1)[0] + "/" + name
        load = os.getloadavg()[0]
        out = subprocess.run(
            [sys.executable, "-c", RUN, url, str(args.groups), str(args.size), str(int(args.busy)),
             str(int(args.refused))],
            env={**os.environ, "PYTHONPATH": str(package), **({"GC_TWO": "1"} if two else {})},
            capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["load"] = load
        return result
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--refused", action="store_true")
    parser.add_argument("--two", action="store_true",
                        help="also NEW_TREE without its one-query attempt (its two-round-trip path)")
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    trees = {"old": args.old, "new": args.new, "two": args.new}
    labels = ["old", "new"] + (["two"] if args.two else [])
    results: dict[str, list[dict]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for label in (labels if rep % 2 == 0 else labels[::-1]):
                r = one_run(trees[label], args, Path(tmp), two=label == "two")
                results[label].append(r)
                print(f"rep {rep} {label}: trips {r['trips']:.1f}  p50 {r['p50_ms']:.2f} ms  "
                      f"p90 {r['p90_ms']:.2f} ms  cpu {r['cpu_us']:.0f} us  "
                      f"server cpu {r['server_us']:.0f} us  "
                      f"load {r['load']:.1f}", flush=True)
                time.sleep(1)
    for label in labels:
        rs = results[label]
        print(f"{label}: trips {rs[0]['trips']:.1f}; p50 ms " + ", ".join(f"{r['p50_ms']:.2f}" for r in rs)
              + "; p90 ms " + ", ".join(f"{r['p90_ms']:.2f}" for r in rs)
              + "; cpu us " + ", ".join(f"{r['cpu_us']:.0f}" for r in rs)
              + "; server cpu us " + ", ".join(f"{r['server_us']:.0f}" for r in rs)
              + f" (median p50 {statistics.median(r['p50_ms'] for r in rs):.2f})")


if __name__ == "__main__":
    main()
