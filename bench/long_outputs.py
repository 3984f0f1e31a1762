"""A daemon step's token write as a request's output grows, source trees alternately, SQLite and PostgreSQL.

    .venv/bin/python bench/long_outputs.py TREE [TREE ...] [--backends sqlite postgresql]
        [--lengths 64 512 2048 8192] [--streams 32] [--steps 40] [--reps 2]

A realtime or streaming request's tokens are written at every step (the
daemon's every-step flush), so what that write costs as the output grows
tells whether a long answer (thousands of tokens, as reasoning models write)
slows every step for every tenant. A tree is a folder of fsched's sources
(`git archive REV | tar -x -C DIR`, or a worktree; "." for this one). Each
rep runs every tree in turn (the order flipped every rep) for each backend
and output length, each in a process of its own on a fresh SQLite file or a
fresh PostgreSQL schema (on postgresql+psycopg://postgres@127.0.0.1:5432/test,
dropped afterwards): `--streams` realtime requests are submitted and claimed,
one `QueueStore.write_step` brings every output to `--lengths` tokens (not
timed), then `--steps` more, each adding one token to every request, are
timed, each saying (as a daemon's writer does) how much of the text its
last write left in the table, where the tree's `TokenUpdate` can say it.
Each run prints a JSON line: the step write's wall time (p50, ms) and
its thread's CPU (p50, µs), both also per request; on PostgreSQL the server's
CPU per step (µs: the run time, from /proc/PID/schedstat, of every process
whose command line starts with "postgres:", over the timed steps: any other
PostgreSQL work in that window counts too); and the 1-minute load average at
its start. Then a table: per backend and length, each tree's figures
(medians over reps) and their ratios to the first tree's in the same rep
(median over reps; 1.00x: no change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))

import online_ab  # noqa: E402

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

RUN = r'''
import json, statistics, sys, time
from pathlib import Path
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission, TokenUpdate
from fsched.core.types import RequestClass
from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_queue import SqlQueueStore

url, length, streams, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def postgres_ns():
    """Run time so far (ns) of each PostgreSQL server process (single-threaded: its schedstat is all)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"postgres:"):
                found[proc.name] = int((proc / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return found

# As a daemon's writer writes them: saying how much of the text its last write left in the table, where
# the tree's updates can say it (a tree that has no such field writes the text whole).
SAYS_KEPT = "text_kept" in getattr(TokenUpdate, "__dataclass_fields__", {})

def updates(held, n, written=None):
    toks, words = tuple(range(1000, 1000 + n)), "word " * n
    kept = {"text_kept": len(written)} if SAYS_KEPT and written is not None else {}
    return [TokenUpdate(r.id, toks, words, 1.0, r.lease_epoch, **kept) for r in held]

spec = parse_job_file(b'{"prompt": "p", "max_tokens": 100000}\n', "x.jsonl")
cat, q = SqlCatalogStore(url), SqlQueueStore(url)
cat.submit_each([JobSubmission(spec, "t", RequestClass.REALTIME, 5, "c") for _ in range(streams)], 10**9)
held = q.claim("d", per_group=1000, lease_s=600, announced=True)
assert len(held) == streams, f"claimed {len(held)} of {streams}"
q.write_step("d", updates(held, length), ())
cpu, wall = [], []
before = postgres_ns()
for step in range(steps):
    ups = updates(held, length + 1 + step, "word " * (length + step))
    c0, w0 = time.thread_time(), time.perf_counter()
    q.write_step("d", ups, ())
    cpu.append(time.thread_time() - c0)
    wall.append(time.perf_counter() - w0)
after = postgres_ns()
server_ns = sum(ns - before.get(pid, 0) for pid, ns in after.items())
wall_p50, cpu_p50 = statistics.median(wall), statistics.median(cpu)
print(json.dumps({"wall_ms_p50": round(1e3 * wall_p50, 3), "cpu_us_p50": round(1e6 * cpu_p50, 1),
                  "wall_us_request": round(1e6 * wall_p50 / streams, 1),
                  "cpu_us_request": round(1e6 * cpu_p50 / streams, 1),
                  "postgres_us_step": round(server_ns / 1e3 / steps, 1) if "postgresql" in url else None}))
'''


def fresh_schema() -> str:
    """A new, empty schema on the PostgreSQL server; its name."""
    name = f"long_outputs_{uuid.uuid4().hex[:12]}"
    engine = create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {name}"))
    engine.dispose()
    return name


def drop_schema(name: str) -> None:
    engine = create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))
    engine.dispose()


def measured(tree: Path, url: str, args, length: int) -> dict:
    """RUN once in a process of its own, with `tree` as package `fsched`: its figures."""
    with tempfile.TemporaryDirectory() as folder:
        package = online_ab.package_of(tree, Path(folder))
        argv = [sys.executable, "-c", RUN, url, str(length), str(args.streams), str(args.steps)]
        done = subprocess.run(argv, text=True, capture_output=True,
                              env={**os.environ, "PYTHONPATH": str(package)})
    if done.returncode != 0:  # a tree that fails says why, not just that it failed
        sys.exit(f"{tree}: the run failed\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(tree: Path, backend: str, length: int, args) -> dict:
    load = os.getloadavg()[0]
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            figures = measured(tree, f"sqlite:///{folder}/t.db", args, length)
    else:
        schema = fresh_schema()
        try:
            figures = measured(tree, f"{PG_URL}?options=-csearch_path%3D{schema}", args, length)
        finally:
            drop_schema(schema)
    return {"tree": str(tree), "backend": backend, "length": length, "streams": args.streams,
            **figures, "load1": round(load, 2)}


FIGURES = (("wall_ms_p50", "wall ms/step"), ("cpu_us_request", "CPU µs/request"),
           ("postgres_us_step", "PostgreSQL µs/step"))


def cell(runs: list[dict], firsts: list[dict], key: str) -> str:
    """A tree's median figure, and its median ratio to the first tree's run of the same rep."""
    values = [r[key] for r in runs if r[key] is not None]
    if not values:
        return "-"
    ratios = [r[key] / f[key] for r, f in zip(runs, firsts, strict=True) if r[key] is not None and f[key]]
    ratio = f" ({statistics.median(ratios):.2f}x)" if ratios else ""
    return f"{statistics.median(values):g}{ratio}"


def summary(rows: list[dict], trees: list[Path], backends: list[str], lengths: list[int]) -> None:
    print(f"\n| backend | length | tree | {' | '.join(label for _, label in FIGURES)} |")
    print("|---|---|---|" + "---|" * len(FIGURES))
    for backend in backends:
        for length in lengths:
            def runs_of(tree: Path, backend: str = backend, length: int = length) -> list[dict]:
                wanted = (str(tree), backend, length)
                return [r for r in rows if (r["tree"], r["backend"], r["length"]) == wanted]

            firsts = runs_of(trees[0])
            for tree in trees:
                cells = [cell(runs_of(tree), firsts, key) for key, _ in FIGURES]
                print(f"| {backend} | {length} | {tree} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 512, 2048, 8192])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for rep in range(args.reps):
        trees = args.trees if rep % 2 == 0 else list(reversed(args.trees))
        for backend in args.backends:
            for length in args.lengths:
                for tree in trees:  # innermost: the trees' runs of one backend and length close in time
                    row = run(tree, backend, length, args)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary(rows, args.trees, args.backends, args.lengths)


if __name__ == "__main__":
    main()
