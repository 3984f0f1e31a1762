"""A daemon step's completions of many online requests on PostgreSQL: their jobs' counters moved in one
statement (storage/counters.py MOVE_JOBS) against a locking select, the state worked out in Python and then
an update (`move_derived`, SQLite's way), in one run.

    .venv/bin/python bench/move_jobs.py [--jobs 8] [--rounds 120]
        [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]

On a fresh database: each round, one group commit stores `--jobs` online requests (jobs of one request),
the daemon's store claims them, then ends them all in one transaction (`finish_requests`), timed; the
rounds alternate between the two ways, the first 20 untimed. Prints each way's p50 and p90 (ms) and their
ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, text  # noqa: E402

from fsched.core.ports.records import Completion  # noqa: E402
from fsched.core.types import RequestClass, RequestStatus  # noqa: E402
from fsched.storage import counters  # noqa: E402
from fsched.storage.db import Database  # noqa: E402
from fsched.storage.sql_catalog import SqlCatalogStore  # noqa: E402
from fsched.storage.sql_queue import SqlQueueStore  # noqa: E402
from tests.support.tables import submission  # noqa: E402


def measured(url: str, jobs: int, rounds: int) -> dict[str, list[float]]:
    """Each way's times (ms) for a transaction ending `jobs` requests, the ways alternating."""
    db = Database(url)
    catalog, queue = SqlCatalogStore(db), SqlQueueStore(db)
    queue.prepare(256)
    together = counters._move_locked_together
    times: dict[str, list[float]] = {"select, then update": [], "one statement": []}
    try:
        for r in range(rounds + 20):
            way = "one statement" if r % 2 else "select, then update"
            counters._move_locked_together = together if r % 2 else counters.move_derived
            catalog.submit_each([submission(1, f"t{i % 4}", RequestClass.REALTIME) for i in range(jobs)],
                                max_queued_per_tenant=10**6)
            claimed = queue.claim("bench", per_group=10**4, announced=True)
            ends = [Completion(c.id, RequestStatus.FINISHED_STOPPED, (5, 6), "xy", lease_epoch=c.lease_epoch)
                    for c in claimed]
            began = time.perf_counter()
            finished = queue.finish_requests(ends, "bench")
            took = (time.perf_counter() - began) * 1e3
            if finished != [True] * jobs:
                raise SystemExit(f"ended {sum(finished)} of {jobs}")
            if r >= 20:
                times[way].append(took)
    finally:
        counters._move_locked_together = together
        db.dispose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    name = f"fsched_move_{uuid.uuid4().hex[:10]}"
    admin = create_engine(args.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        times = measured(args.url.rsplit("/", 1)[0] + f"/{name}", args.jobs, args.rounds)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    figures = {}
    for way, taken in times.items():
        taken.sort()
        figures[way] = (taken[len(taken) // 2], taken[int(len(taken) * 0.9)])
        print(f"{way:>20}: p50 {figures[way][0]:.2f} ms  p90 {figures[way][1]:.2f} ms  ({len(taken)} steps)")
    (p50, p90), (base50, base90) = figures["one statement"], figures["select, then update"]
    print(f"completions of {args.jobs} online requests: one statement / select, then update "
          f"p50 {p50 / base50:.2f}x, p90 {p90 / base90:.2f}x")


if __name__ == "__main__":
    main()
