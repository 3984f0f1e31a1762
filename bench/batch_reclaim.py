"""What reclaiming an ended batch's rows costs: its time, its longest write transaction, the space back.

    .venv/bin/python bench/batch_reclaim.py [--lines 20000] [--words 1000] [--db URL]

Stores one cancelled batch of `lines` completions lines (a prompt of `words`
words each) in a new job table (a new SQLite file, or the empty database at
--db URL), then reclaims it through the file store, timing every write
transaction and the step that gives the space back (SQLite: incremental
vacuum in bounded steps; PostgreSQL: VACUUM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

from fsched.core.jobs.batches import BatchRecord, new_batch_id, stored_bytes_of
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission
from fsched.core.types import RequestClass
from fsched.storage.db import Database
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.sql_files import SqlFileStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--words", type=int, default=1000)
    parser.add_argument("--db", default=None)
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="fsched-reclaim-"), "fsched.db")
    db = Database(args.db or f"sqlite:///{path}")
    store, files = SqlJobStore(db), SqlFileStore(db)
    data = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "m", "prompt": f"line {i} " + "word " * args.words,
                                        "max_tokens": 4}}) + "\n" for i in range(args.lines)).encode()
    requests = parse_job_file(data, "input.jsonl")
    (job,) = store.submit([JobSubmission(requests, "t", RequestClass.BATCH, 5, "bench")])
    store.cancel_job(job.job_id)
    files.add_batch(BatchRecord(new_batch_id(), "t", job.job_id, "/v1/completions", "file-x", "24h", None,
                                time.time(), stored_bytes=stored_bytes_of(requests)))
    before = _size(db, path)

    longest, space = [0.0], [0.0]
    write, reclaim_space = db.write, db.reclaim_space

    @contextlib.contextmanager
    def timed_write():
        started = time.perf_counter()
        with write() as conn:
            yield conn
        longest[0] = max(longest[0], time.perf_counter() - started)

    def timed_space(**kwargs) -> None:
        started = time.perf_counter()
        reclaim_space(**kwargs)
        space[0] += time.perf_counter() - started

    db.write, db.reclaim_space = timed_write, timed_space
    started = time.perf_counter()
    files.reclaim_batches(time.time() + 60)
    took = time.perf_counter() - started
    print(f"{len(data) / 1e6:.0f} MB input, {len(requests):,} rows ({db.dialect}): "
          f"reclaimed in {took:.2f} s, "
          f"longest write transaction {longest[0] * 1000:.0f} ms, giving the space back {space[0]:.2f} s; "
          f"table {before / 1e6:.1f} MB -> {_size(db, path) / 1e6:.1f} MB")
    db.dispose()


def _size(db: Database, path: str) -> int:
    """The SQLite file and its WAL, or PostgreSQL's requests table with its indexes and TOAST."""
    if db.dialect == "sqlite":
        return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    with db.read() as conn:
        return conn.exec_driver_sql("SELECT pg_total_relation_size('requests')").scalar_one()


if __name__ == "__main__":
    main()
