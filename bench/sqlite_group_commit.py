"""The HTTP server's group commit on SQLite alone, source trees alternately: its thread's CPU.

    .venv/bin/python bench/sqlite_group_commit.py TREE [TREE ...] [--reps 2] [--groups 300] [--size 2]

A tree is a folder of fsched's sources (`git archive REV | tar -x -C DIR`,
or a worktree). Each rep runs every tree in turn (the order flipped every
rep), each in a process of its own on a fresh SQLite file: `--groups` group
commits (`SqlCatalogStore.submit_each`) of `--size` one-request online jobs
of one tenant, each with an API key, after 20 not timed; every 50 the jobs
end (as a daemon ends them), so the tenant's count stays small. Each run
prints the thread CPU of a group commit (p50, mean), its wall time (p50)
and the 1-minute load average at its start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trees import run_in_tree  # noqa: E402

RUN = r'''
import json, statistics, sys, tempfile, time
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission
from fsched.core.types import JobOrigin, RequestClass
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_keys import SqlKeyStore
from sqlalchemy import text

groups, size = int(sys.argv[1]), int(sys.argv[2])
store = SqlCatalogStore(f"sqlite:///{tempfile.mkdtemp()}/t.db")
key, _ = SqlKeyStore(store.db).create_key("carol", RequestClass.REALTIME)
line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 64}}
specs = parse_job_file((json.dumps(line) + "\n").encode(), "online")
def job():
    return JobSubmission(specs, "carol", RequestClass.REALTIME, 5, "chat", JobOrigin.ONLINE, key.id)
for _ in range(20):
    store.submit_each([job() for _ in range(size)], 100_000)
cpu, wall = [], []
for i in range(groups):
    jobs = [job() for _ in range(size)]
    c0, w0 = time.thread_time(), time.perf_counter()
    store.submit_each(jobs, 100_000)
    cpu.append(time.thread_time() - c0)
    wall.append(time.perf_counter() - w0)
    if i % 50 == 0:
        with store.db.write() as conn:
            conn.execute(text("UPDATE jobs SET state = 'completed', num_done = num_requests"))
print(json.dumps({"cpu_us_p50": round(1e6 * statistics.median(cpu), 1),
                  "cpu_us_mean": round(1e6 * statistics.mean(cpu), 1),
                  "wall_us_p50": round(1e6 * statistics.median(wall), 1)}))
'''


def run(tree: Path, groups: int, size: int) -> dict:
    load = os.getloadavg()[0]
    figures = run_in_tree(tree, RUN, str(groups), str(size))
    return {"tree": str(tree), "size": size, **figures, "load1": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--size", type=int, default=2)
    args = parser.parse_args()
    for rep in range(args.reps):
        trees = args.trees if rep % 2 == 0 else list(reversed(args.trees))
        for tree in trees:
            print(json.dumps(run(tree, args.groups, args.size)), flush=True)


if __name__ == "__main__":
    main()
