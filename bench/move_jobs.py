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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from two_ways import DEFAULT_URL, fresh_database, print_two_ways  # noqa: E402

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
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()
    with fresh_database(args.url, "fsched_move") as url:
        times = measured(url, args.jobs, args.rounds)
    print_two_ways(times, "select, then update", "one statement",
                   f"completions of {args.jobs} online requests")


if __name__ == "__main__":
    main()
