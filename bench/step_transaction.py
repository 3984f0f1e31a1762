"""What one transaction a daemon step saves: a step's completion and its claim of an announced online
request written as two transactions (`finish_requests`, then `claim`) or as one (`write_step`).

    .venv/bin/python bench/step_transaction.py [--backends sqlite postgresql] [--steps 2000] [--held 32]

A daemon holds `--held` online requests (jobs of one, as `fsched serve` stores them). Each step one of
them ends (its completion written, fenced by its lease) and one new request, submitted before the
step, is claimed in its place. The two ways alternate step by step on the same table, so the
machine's load weighs on both alike. Printed per way: the CPU of this process (the daemon's side; on
PostgreSQL the server's is not counted) per request, mean and median, the step's wall time (median), and
the statements a step runs (SQLite's trace: BEGIN and COMMIT included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.queue import ClaimAsk
from fsched.core.ports.records import Completion, JobSubmission
from fsched.core.types import RequestClass, RequestStatus
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_queue import SqlQueueStore

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
GROUP = ("alice", RequestClass.STREAMING)
LINE = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}) + "\n"


def table_url(backend: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    import psycopg

    name = f"fsched_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def step(queue: SqlQueueStore, held: list, one_transaction: bool, per_group: int) -> tuple[float, float]:
    """End the oldest held request and claim the waiting one; this process's CPU seconds for it, and
    the wall seconds (on PostgreSQL the round trips' waits in them)."""
    ended = held.pop(0)
    completion = Completion(ended.id, RequestStatus.FINISHED_LENGTH, (1,) * 8, "x" * 8,
                            lease_epoch=ended.lease_epoch)
    start, began = time.process_time(), time.perf_counter()
    if one_transaction:
        claimed = queue.write_step("d1", (), [completion], ClaimAsk(per_group, {GROUP: len(held)})).claimed
    else:
        queue.finish_requests([completion], "d1")
        claimed = queue.claim("d1", per_group, {GROUP: len(held)}, announced=True)
    spent, wall = time.process_time() - start, time.perf_counter() - began
    assert len(claimed) == 1
    held += claimed
    return spent, wall


def run(backend: str, steps: int, per_group: int) -> list[dict]:
    url = table_url(backend)
    catalog, queue = SqlCatalogStore(url), SqlQueueStore(url)
    job = JobSubmission(parse_job_file(LINE.encode(), "online.jsonl"), "alice", RequestClass.STREAMING, 5,
                        "online")
    catalog.submit([job] * per_group)
    held = queue.claim("d1", per_group, announced=True)
    said: list[str] = []
    if backend == "sqlite":
        queue.direct._connection().raw.set_trace_callback(said.append)
    spent: dict[bool, list[float]] = {False: [], True: []}
    walls: dict[bool, list[float]] = {False: [], True: []}
    statements: dict[bool, int] = {False: 0, True: 0}
    for i in range(steps + 40):
        one = i % 2 == 1
        catalog.submit([job])  # the request a server announced
        said.clear()
        cpu, wall = step(queue, held, one, per_group)
        if i >= 40:  # the statements' variants compiled, the caches warm
            spent[one].append(cpu)
            walls[one].append(wall)
            statements[one] = len(said)
    queue.db.dispose()
    catalog.db.dispose()
    return [{"backend": backend, "way": "one transaction" if one else "two transactions",
             "us_per_request": round(1e6 * statistics.fmean(spent[one]), 1),
             "median_us": round(1e6 * statistics.median(spent[one]), 1),
             "wall_median_us": round(1e6 * statistics.median(walls[one]), 1),
             "statements": statements[one] if backend == "sqlite" else None} for one in (False, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--held", type=int, default=32)
    args = parser.parse_args()
    rows = [row for backend in args.backends for row in run(backend, args.steps, args.held)]
    for row in rows:
        print(json.dumps(row))
    print("\n| backend | way | µs CPU per request (mean) | median | wall µs a step (median) "
          "| statements a step (SQLite) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['way']} | {r['us_per_request']} | {r['median_us']} "
              f"| {r['wall_median_us']} | {r['statements'] if r['statements'] is not None else '-'} |")


if __name__ == "__main__":
    main()
