"""An online request's cost on a fresh job table and on one aged by many finished chats, trees alternately.

    .venv/bin/python bench/aged_table.py TREE [TREE ...] [--backends sqlite postgresql]
        [--finished 200000] [--reps 1] [--concurrency 32] [--rounds 30] [--tokens 4] [--step-ms 20]

Every streamed chat is a job of its own, and nothing deletes a finished one:
a server that has answered a million chats holds a million finished jobs
and their request rows. Each rep runs every tree (`git archive REV | tar
-x -C DIR`, or a worktree; the order flipped every rep), each on a fresh
table of each backend: the paced engine, `fsched daemon`, one `fsched
serve`, and bench/online_path.py's light client (`--concurrency` streamed chats
at once, `--rounds` each, `--tokens` tokens an answer: short answers, so
the request's own cost is most of it). The load runs on the fresh table,
then `--finished` finished online jobs (each with its request row, as a
chat leaves them) are written into the table, and the same load runs
again. Per run: CPU per request of serve (all threads), of the daemon and,
on PostgreSQL, of the database server's processes; the first token's p50
and p99; the load's wall time; then, per tree and backend, the aged run's
figures over the fresh run's (1.00x: the table's age costs nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fast_path  # noqa: E402
import online_ab  # noqa: E402
import online_path  # noqa: E402
import request_cpu  # noqa: E402
from fast_path import Engine  # noqa: E402
from sqlalchemy import text  # noqa: E402

FILL_CHUNK = 20_000
JOB_ROW = ("INSERT INTO jobs (id, tenant, class, priority, name, origin, state, num_requests, num_done, "
           "num_failed, num_cancelled, num_running, num_output_tokens, num_prompt_tokens, submitted_at, "
           "started_at, finished_at) VALUES (:id, 'bench', 'realtime', 5, 'chat', 'online', 'completed', "
           "1, 1, 0, 0, 0, 4, 12, 1, 1, 2)")
REQUEST_ROW = ("INSERT INTO requests (job_id, idx, custom_id, choice, endpoint, messages, render, params, "
               "max_tokens, state, output_tokens, output_text, num_logprobs, num_output_tokens, "
               "prompt_tokens, finish_reason, attempts, enqueued_at, first_token_at, finished_at, "
               "lease_epoch) VALUES (:id, 0, 'chat', 0, '/v1/chat/completions', :messages, '{}', :params, 4, "
               "'done', '[11, 12, 13, 14]', 'a b c d', 0, 4, 12, 'length', 1, 1, 1.5, 2, 1)")
PARAMS = json.dumps({"max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 7, "stop": [],
                     "max_tokens_is_default": False})


def age(table: fast_path.Table, finished: int) -> float:
    """Write `finished` finished online jobs (and their request rows) into the table; the seconds it took."""
    began = time.time()
    messages = json.dumps(online_path.MESSAGES)
    with table.db.begin() as conn:
        first = conn.execute(text("SELECT coalesce(max(id), 0) FROM jobs")).scalar() + 1
        for low in range(first, first + finished, FILL_CHUNK):
            ids = range(low, min(low + FILL_CHUNK, first + finished))
            conn.execute(text(JOB_ROW), [{"id": i} for i in ids])
            conn.execute(text(REQUEST_ROW), [{"id": i, "messages": messages, "params": PARAMS} for i in ids])
        if table.backend == "postgresql":  # ids given: the sequence moves past them, and the planner learns
            conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), "
                              "(SELECT max(id) FROM jobs))"))
    if table.backend == "postgresql":
        with table.db.connect() as conn:
            conn.execute(text("ANALYZE"))
            conn.commit()
    return time.time() - began


def measured(tree: Path, f: online_path.Fsched, args) -> dict:
    """The load once (bench/request_cpu.py's measure, with the light client)."""
    return request_cpu.measured(str(tree), f, args, args.concurrency, client="light")


FIGURES = ("serve_us_request", "daemon_us_request", "postgres_us_request", "ttft_p50_ms", "ttft_p99_ms",
           "wall_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--finished", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()
    engine = Engine(256, args.step_ms)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            commands = [online_ab.launcher(t, Path(tmp) / str(i)) for i, t in enumerate(args.trees)]
            for rep in range(args.reps):
                order = list(range(len(args.trees)))[::-1 if rep % 2 else 1]
                for i in order:
                    fast_path.FSCHED = online_path.FSCHED = commands[i]
                    for backend in args.backends:
                        with tempfile.TemporaryDirectory() as folder:
                            f = online_path.Fsched(engine, backend, Path(folder), 1, link=True)
                            try:
                                fresh = measured(args.trees[i], f, args)
                                filled_s = age(f.table, args.finished)
                                aged = measured(args.trees[i], f, args)
                            finally:
                                f.close()
                        row = {"tree": str(args.trees[i]), "backend": backend, "finished": args.finished,
                               "filled_s": round(filled_s, 1), "fresh": fresh, "aged": aged}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        engine.__exit__()
    print(f"\n| tree | backend | {' | '.join(f'{name} fresh → aged' for name in FIGURES)} |")
    print("|---|---|" + "---|" * len(FIGURES))
    for r in rows:
        fresh, aged = r["fresh"], r["aged"]
        cells = [f"{fresh[k]} → {aged[k]} ({aged[k] / fresh[k]:.2f}x)" if fresh[k] > 0 else "-"
                 for k in FIGURES]
        print(f"| {r['tree']} | {r['backend']} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
