"""A fresh server's first online requests: what each one spends in fsched, one request at a time.

    .venv/bin/python bench/first_request.py [--backend sqlite|postgresql] [--requests 3] [--runs 4]

Each run starts the paced engine (tests/support/paced_engine.py, 256 slots x 20 ms), a fresh table, one
`fsched daemon --engine URL` and one `fsched serve` (bench/online_path.py's fsched arm, with the stamps
of core/stamps.py on), waits 2 s, and sends `--requests` streamed chats of 4 tokens one after another
with bench/light_client.py. A row a run: each request's first token as its client saw it, and fsched's
own part of it: from the server's reading of the request's head to its first chunk written, less the
engine's own time from the daemon's request to its first token (the paced engine's iterations move a
first token by up to 20 ms, which this takes out). The first request pays for whatever a server and a
daemon do once; the next ones are the steady state.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import online_path  # noqa: E402
from fast_path import Engine  # noqa: E402

SETTLE_S = 2.0  # after the processes start: the server's start-up work and the daemon's first beat done


def one_run(backend: str, requests: int) -> tuple[list[float], list[float]]:
    """One fresh serve + daemon: each request's first token (ms) and fsched's own part of it (ms)."""
    with Engine(256, 20.0, None) as engine, tempfile.TemporaryDirectory() as tmp:
        stamps = Path(tmp) / "stamps"
        fsched = online_path.Fsched(engine, backend, Path(tmp), 1, link=True, stamps=stamps)
        try:
            time.sleep(SETTLE_S)
            firsts = [first_token_ms(fsched) for _ in range(requests)]
        finally:
            fsched.close()
        return firsts, own_parts(stamps)


def first_token_ms(fsched: online_path.Fsched) -> float:
    """One streamed chat of 4 tokens, tagged for the stamps: its first token as the client saw it."""
    return asyncio.run(online_path._light_load(fsched.urls, fsched.key, "fsched", 1, 1, 4, True, None))[
        "ttft_p50_ms"]


def own_parts(folder: Path) -> list[float]:
    """Each job's head read to first chunk written, less its engine's request to first token read (ms)."""
    jobs: dict[int, dict[str, float]] = {}
    for path in folder.rglob("*.txt"):
        for line in path.read_text().splitlines():
            stage, job, at = line.split()
            if stage != "tag":
                jobs.setdefault(int(job), {}).setdefault(stage, float(at))
    return [1000 * ((s["written"] - s["arrived"]) - (s["read"] - s["sent"])) for _, s in sorted(jobs.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    print("| run | first token, ms (each request) | fsched's own part, ms (each request) |")
    print("|---|---|---|")
    first_parts, later_parts = [], []
    for run in range(1, args.runs + 1):
        firsts, parts = one_run(args.backend, args.requests)
        first_parts.append(parts[0])
        later_parts += parts[1:]
        print(f"| {run} | {', '.join(f'{t:.1f}' for t in firsts)} | {', '.join(f'{p:.1f}' for p in parts)} |",
              flush=True)
    if later_parts:
        print(f"\n{args.backend}: fsched's own part of the first request {min(first_parts):.1f}-"
              f"{max(first_parts):.1f} ms, of the next ones {statistics.median(later_parts):.1f} ms (median)")


if __name__ == "__main__":
    main()
