"""A batch job relayed from vLLM with each token its own chunk against several tokens a chunk, in one run.

    .venv/bin/python bench/batch_chunks.py [--intervals 1 8] [--reps 2] [--requests 256] [--tokens 64]
        [--slots 64] [--engine-api tokens|completions] [--backend sqlite|postgresql]

vLLM's CPU build serves the tiny model (started once, as bench/online_path.py
starts it: `--max-num-seqs --slots`, `--tokens-only` for the token interface,
its session at nice 10). Each arm submits the same batch job (`--requests`
prompts, `--tokens` tokens each, greedy, ignore_eos) to a fresh table and runs
`fsched daemon --engine URL --batch-stream-interval N` (started first: its
start is not measured) until every request is done; the arms alternate
over the intervals, `--reps` times. Per arm: tok/s (the job's tokens from
its submit to its last request done), the CPU per token of the daemon,
of vLLM's API server process and of vLLM's whole session (API server and
engine core), and whether every output equals the first arm's (greedy:
the interval changes how tokens travel, never which).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fast_path import Table, cpu_s  # noqa: E402
from online_path import Vllm  # noqa: E402


def job_lines(requests: int, tokens: int) -> list[dict]:
    return [{"custom_id": f"b{i}", "prompt": f"batch request {i} of the chunked relay", "max_tokens": tokens,
             "temperature": 0, "ignore_eos": True} for i in range(requests)]


def arm(vllm: Vllm, backend: str, interval: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        table = Table(backend, Path(tmp))
        try:
            table.fsched("tenants", "add", "bench")
            daemon = table.daemon("--model", vllm.folder, "--engine", vllm.url,
                                  "--max-batch", str(vllm.slots), "--engine-api", vllm.engine_api,
                                  "--batch-stream-interval", str(interval))
            try:  # measured from the submit on: the daemon's start (imports, tokenizer) is not the relay's
                table.wait("SELECT COUNT(*) FROM daemons", lambda r: r[0] > 0, 120)
                job = Path(tmp) / "job.jsonl"
                job.write_text("".join(json.dumps(x) + "\n" for x in job_lines(args.requests, args.tokens)))
                engine, api, own = vllm.cpu_s(), vllm.api_cpu_s(), cpu_s(daemon.pid)
                started = time.monotonic()
                table.fsched("submit", str(job), "--tenant", "bench", "--class", "batch")
                table.wait("SELECT COUNT(*) FROM requests WHERE state <> 'done'", lambda r: r[0] == 0, 600,
                           every=0.01)
                wall = time.monotonic() - started
                engine, api, own = vllm.cpu_s() - engine, vllm.api_cpu_s() - api, cpu_s(daemon.pid) - own
            finally:
                daemon.terminate()
                daemon.wait(30)
            from sqlalchemy import text

            with table.db.connect() as conn:
                outputs = dict(conn.execute(text("SELECT custom_id, output_tokens FROM requests")).all())
            tokens = sum(len(json.loads(o) if isinstance(o, str) else o) for o in outputs.values())
            return {"interval": interval, "tokens": tokens, "wall_s": round(wall, 2),
                    "tok_s": round(tokens / wall, 1),
                    "daemon_us_per_token": round(1e6 * own / tokens, 1),
                    "api_server_us_per_token": round(1e6 * api / tokens, 1),
                    "vllm_us_per_token": round(1e6 * engine / tokens, 1),
                    "outputs": outputs}
        finally:
            table.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--engine-api", choices=["tokens", "completions"], default="tokens")
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--engine-nice", type=int, default=10)
    args = parser.parse_args()
    log = Path(tempfile.gettempdir()) / f"batch_chunks-vllm-{os.getpid()}.log"
    print(f"vLLM's log: {log}", flush=True)
    rows, first = [], None
    with Vllm(args.slots, args.engine_nice, log, args.engine_api) as vllm:
        for _ in range(args.reps):
            for interval in args.intervals:
                row = arm(vllm, args.backend, interval, args)
                outputs = row.pop("outputs")
                first = first or outputs
                row["same_outputs"] = outputs == first
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("\n| interval | tok/s | daemon µs/token | vLLM API server µs/token | vLLM session µs/token | "
          "same outputs |\n|---|---|---|---|---|---|")
    for interval in args.intervals:
        mine = [r for r in rows if r["interval"] == interval]
        keys = ("tok_s", "daemon_us_per_token", "api_server_us_per_token", "vllm_us_per_token")
        cells = [", ".join(f"{r[k]:,}" for r in mine)
                 + f" (median {round(statistics.median(r[k] for r in mine), 1):,})" for k in keys]
        print(f"| {interval} | {' | '.join(cells)} | {all(r['same_outputs'] for r in mine)} |")


if __name__ == "__main__":
    main()
