"""How long each writer holds SQLite's write lock on the online path, source trees alternately.

    .venv/bin/python bench/write_lock.py TREE [TREE ...] [--reps 2] [--rounds 200] [--size 32]
        [--tokens 64]

SQLite has one writer at a time: while the server's group commit stores new
requests, the daemon's claim of them and its completions of the last ones
wait for the lock, and the other way round. A tree is a folder of fsched's
sources (`git archive REV | tar -x -C DIR`, or a worktree). Each rep runs
every tree in turn (the order flipped every rep), each in a process of its
own on a fresh SQLite file: `--rounds` rounds (after 20 not timed) of a group
commit of `--size` online chat requests (one tenant's API key, as `fsched
serve` stores them), the daemon's claim of them (`SqlQueueStore.claim`, as a
server's announcement asks) and their completions of `--tokens` tokens each
(`finish_requests`). For each of the three: how long its transaction held the
write lock (from its BEGIN IMMEDIATE taken to its COMMIT done), p50 and p90,
and its call's wall time p50, in µs; and the 1-minute load average at the
start.
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
import json, statistics, sys, tempfile, threading, time
from contextlib import contextmanager
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import Completion, JobSubmission
from fsched.core.types import JobOrigin, RequestClass, RequestStatus
from fsched.storage import direct
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_keys import SqlKeyStore
from fsched.storage.sql_queue import SqlQueueStore

rounds, size, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
local = threading.local()
holds = []
take_lock = direct.begin_immediate
def timed_begin(*args, **kwargs):
    take_lock(*args, **kwargs)
    local.taken = time.perf_counter()
direct.begin_immediate = timed_begin
transaction = direct.DirectConnection._transaction
@contextmanager
def timed_transaction(self, write, *args, **kwargs):
    local.taken = None
    with transaction(self, write, *args, **kwargs) as tx:
        yield tx
    if write and local.taken is not None:
        holds.append(time.perf_counter() - local.taken)
direct.DirectConnection._transaction = timed_transaction

catalog = SqlCatalogStore(f"sqlite:///{tempfile.mkdtemp()}/t.db")
queue = SqlQueueStore(catalog.db)
queue.prepare(256)
key, _ = SqlKeyStore(catalog.db).create_key("carol", RequestClass.REALTIME)
line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": tokens}}
specs = parse_job_file((json.dumps(line) + "\n").encode(), "online")
def job():
    return JobSubmission(specs, "carol", RequestClass.REALTIME, 5, "chat", JobOrigin.ONLINE, key.id)
text = "word " * tokens
figures = {"group commit": ([], []), "claim": ([], []), "completions": ([], [])}
def timed(name, call, measured):
    holds.clear()
    began = time.perf_counter()
    out = call()
    if measured:
        figures[name][0].append(holds[-1])
        figures[name][1].append(time.perf_counter() - began)
    return out
for r in range(rounds + 20):
    measured = r >= 20
    timed("group commit", lambda: catalog.submit_each([job() for _ in range(size)], 100_000), measured)
    claimed = timed("claim", lambda: queue.claim("bench", per_group=10**4, announced=True), measured)
    assert len(claimed) == size, len(claimed)
    ends = [Completion(c.id, RequestStatus.FINISHED_LENGTH, tuple(range(100, 100 + tokens)), text, 5, "m",
                       None, time.time(), c.lease_epoch) for c in claimed]
    timed("completions", lambda: queue.finish_requests(ends, owner="bench"), measured)
def p(values, q):
    return round(1e6 * sorted(values)[int(q * (len(values) - 1))], 1)
print(json.dumps({name: {"hold_us_p50": p(h, 0.5), "hold_us_p90": p(h, 0.9), "wall_us_p50": p(w, 0.5)}
                  for name, (h, w) in figures.items()}))
'''


def run(tree: Path, rounds: int, size: int, tokens: int) -> dict:
    load = os.getloadavg()[0]
    figures = run_in_tree(tree, RUN, str(rounds), str(size), str(tokens))
    return {"tree": str(tree), "size": size, **figures, "load1": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for rep in range(args.reps):
        trees = args.trees if rep % 2 == 0 else list(reversed(args.trees))
        for tree in trees:
            rows.append(run(tree, args.rounds, args.size, args.tokens))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.size} online requests a round, {args.tokens} tokens each; µs, median of {args.reps} reps")
    print("| tree | group commit hold p50 / p90 | claim hold p50 / p90 | completions hold p50 / p90 |")
    print("|---|---|---|---|")
    for tree in args.trees:
        mine = [r for r in rows if r["tree"] == str(tree)]
        cells = []
        for name in ("group commit", "claim", "completions"):
            p50 = sorted(r[name]["hold_us_p50"] for r in mine)[len(mine) // 2]
            p90 = sorted(r[name]["hold_us_p90"] for r in mine)[len(mine) // 2]
            cells.append(f"{p50:,.0f} / {p90:,.0f}")
        print(f"| {tree} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
