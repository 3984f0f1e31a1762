"""Claim + complete throughput of the job table: the storage side of serving, without a model.

Each worker process is one daemon's storage traffic: claim a batch of
queued requests (a lease each, fair per tenant and class), then end them all
in one transaction, fenced by owner and lease epoch, until the queue is empty.
Measured on SQLite with one daemon and on PostgreSQL with several.

Baseline, in the same run: the same loop one request per transaction (the
way a naive queue works), so the figure says what batching the claim buys.

    .venv/bin/python bench/claim.py                     # both backends
    .venv/bin/python bench/claim.py --backend sqlite --requests 50000
    .venv/bin/python bench/claim.py --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Goals: PostgreSQL with 4 daemons >= 2,000 requests/s; SQLite
with one daemon >= 5,000 requests/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
import uuid
from pathlib import Path

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import Completion, JobSubmission
from fsched.core.types import RequestClass, RequestStatus
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_queue import SqlQueueStore

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def fill(url: str, n: int) -> None:
    """n requests, half for each of two tenants."""
    store = SqlCatalogStore(url)
    for tenant in ("alice", "bob"):
        lines = (json.dumps({"prompt": f"p{i}", "max_tokens": 8, "seed": i}) for i in range(n // 2))
        data = "".join(line + "\n" for line in lines)
        parsed = parse_job_file(data.encode(), f"{tenant}.jsonl")
        store.submit([JobSubmission(parsed, tenant, RequestClass.BATCH, 5, f"{tenant}.jsonl")])
    store.db.dispose()


def worker(url: str, per_group: int, start, done_count) -> None:
    store = SqlQueueStore(url)
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    start.wait()
    finished = 0
    while True:
        claimed = store.claim(owner, per_group=per_group, lease_s=60)
        if not claimed:
            if not store.has_queued():
                break
            continue
        outcome = store.finish_requests(
            [Completion(c.id, RequestStatus.FINISHED_LENGTH, (1, 2, 3), "abc",
                        lease_epoch=c.lease_epoch) for c in claimed],
            owner,
        )
        assert all(outcome), "a completion was refused"
        finished += len(claimed)
    with done_count.get_lock():
        done_count.value += finished
    store.db.dispose()


def measure(url: str, n: int, daemons: int, per_group: int) -> float:
    fill(url, n)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    done_count = ctx.Value("i", 0)
    procs = [ctx.Process(target=worker, args=(url, per_group, start, done_count)) for _ in range(daemons)]
    for p in procs:
        p.start()
    time.sleep(1.5)  # let every worker import and connect before the clock starts
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    assert done_count.value == n, f"{done_count.value} of {n} requests completed"
    return n / wall


class PgDatabase:
    """A fresh PostgreSQL database for one measurement."""

    def __init__(self, admin_url: str):
        self.admin = admin_url.replace("postgresql+psycopg://", "postgresql://")
        self.name = f"fsched_bench_{uuid.uuid4().hex[:10]}"
        self.url = admin_url.rsplit("/", 1)[0] + "/" + self.name

    def __enter__(self) -> str:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self.url

    def __exit__(self, *exc) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["both", "sqlite", "postgresql"], default="both")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--baseline-requests", type=int, default=2_000)
    ap.add_argument("--pg-daemons", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=128, help="claim size per (tenant, class) group")
    ap.add_argument("--pg-url", default=PG_ADMIN, help="an admin URL; a fresh database is made beside it")
    args = ap.parse_args()
    rows = []
    if args.backend in ("both", "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            rate = measure(f"sqlite:///{Path(tmp) / 'a.db'}", args.requests, 1, args.per_group)
            base = measure(f"sqlite:///{Path(tmp) / 'b.db'}", args.baseline_requests, 1, 1)
        rows.append(("sqlite", 1, rate, base, 5_000))
    if args.backend in ("both", "postgresql"):
        with PgDatabase(args.pg_url) as url:
            rate = measure(url, args.requests, args.pg_daemons, args.per_group)
        with PgDatabase(args.pg_url) as url:
            base = measure(url, args.baseline_requests, args.pg_daemons, 1)
        rows.append(("postgresql", args.pg_daemons, rate, base, 2_000))
    header = f"{'backend':<11} {'daemons':>7} {'claim+complete/s':>17} {'one-at-a-time/s':>16} {'ratio':>6}"
    print(header + "  goal")
    for backend, daemons, rate, base, goal in rows:
        verdict = "met" if rate >= goal else "MISSED"
        print(f"{backend:<11} {daemons:>7} {rate:>17,.0f} {base:>16,.0f} {rate / base:>5.1f}x  "
              f">= {goal:,}/s {verdict}")


if __name__ == "__main__":
    main()
