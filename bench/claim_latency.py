"""A daemon's claim of new online requests on PostgreSQL: its wall time, the claim of jobs of one request in
two round trips (storage/claim.py `claim_at_once`) against the general claim's transaction, in one run.

    .venv/bin/python bench/claim_latency.py [--jobs 8] [--rounds 200] [--busy 0]
        [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]

On a fresh database: each round, one group commit stores `--jobs` online requests (jobs of one request, four
tenants, realtime), then the daemon's store claims them (`SqlQueueStore.claim`, announced), timed; the rounds
alternate between the two ways (the general one: `claim_at_once` answering None, as for a claim it leaves to
`lease_requests`), the first 20 untimed. Between rounds the claimed rows are ended, so every claim finds only
its round's jobs. `--busy N`: N processes spin meanwhile (a machine whose cores are taken, as in a burst of
online requests). Prints each way's p50 and p90 (ms) and their ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sqlalchemy import text  # noqa: E402
from two_ways import DEFAULT_URL, fresh_database, print_two_ways  # noqa: E402

from fsched.core.types import RequestClass  # noqa: E402
from fsched.storage import sql_queue  # noqa: E402
from fsched.storage.db import Database  # noqa: E402
from fsched.storage.sql_catalog import SqlCatalogStore  # noqa: E402
from fsched.storage.sql_queue import SqlQueueStore  # noqa: E402
from tests.support.tables import submission  # noqa: E402


def spin() -> None:
    while True:
        pass


def measured(url: str, jobs: int, rounds: int) -> dict[str, list[float]]:
    """Each way's claim times (ms), the ways alternating round by round."""
    db = Database(url)
    catalog, queue = SqlCatalogStore(db), SqlQueueStore(db)
    queue.prepare(256)
    at_once = sql_queue.claim_at_once
    times: dict[str, list[float]] = {"general": [], "two round trips": []}
    try:
        for r in range(rounds + 20):
            way = "two round trips" if r % 2 else "general"
            sql_queue.claim_at_once = at_once if r % 2 else (lambda *args, **kwargs: None)
            catalog.submit_each([submission(1, f"t{i % 4}", RequestClass.REALTIME) for i in range(jobs)],
                                max_queued_per_tenant=10**6)
            began = time.perf_counter()
            claimed = queue.claim("bench", per_group=10**4, announced=True)
            took = (time.perf_counter() - began) * 1e3
            if len(claimed) != jobs:
                raise SystemExit(f"claimed {len(claimed)} of {jobs}")
            if r >= 20:
                times[way].append(took)
            with db.write() as conn:  # ended: the next claim finds only its own round's jobs
                conn.execute(text("UPDATE requests SET state = 'done' WHERE state = 'running'"))
                conn.execute(text("UPDATE jobs SET state = 'completed', num_running = 0, "
                                  "num_done = num_requests WHERE state <> 'completed'"))
    finally:
        sql_queue.claim_at_once = at_once
        db.dispose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()
    spinners = [mp.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for s in spinners:
        s.start()
    try:
        with fresh_database(args.url, "fsched_claim") as url:
            times = measured(url, args.jobs, args.rounds)
    finally:
        for s in spinners:
            s.terminate()
    print_two_ways(times, "general", "two round trips",
                   f"claim of {args.jobs} online requests, {args.busy} busy processes")


if __name__ == "__main__":
    main()
