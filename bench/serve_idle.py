"""`fsched serve`'s CPU while no request runs, two source trees alternately: right after requests, and later.

    .venv/bin/python bench/serve_idle.py OLD_TREE NEW_TREE [--reps 2] [--backends sqlite postgresql]
        [--seconds 5] [--later 11]

A tree is a folder of fsched's sources (`git archive REV | tar -x -C DIR`, or a worktree). Each rep
runs both trees in turn (the order flipped every rep), on each backend: the paced engine, `fsched
daemon` and one `fsched serve` over a fresh table (bench/online_path.py's fsched arm), a few warm-up
requests, then serve's CPU (every thread's run time, ns, `/proc/PID/task/*/schedstat`) over
`--seconds` right after them, and again over `--seconds` from `--later` seconds after them. What a
server does on its own between requests (its hub's ticks, its facts kept fresh while requests come:
api/facts.py) shows in the first figure; the second is a server left alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fast_path  # noqa: E402
import online_ab  # noqa: E402
import online_path  # noqa: E402
from fast_path import Engine  # noqa: E402


def run_time_ns(pid: int) -> int:
    """Every thread's run time so far, ns."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks)


def idle_ms_per_s(engine: Engine, command: str, backend: str, seconds: float,
                  later: float) -> tuple[float, float]:
    """serve's CPU, ms a second, over `seconds` right after a few requests and from `later` s after them."""
    fast_path.FSCHED = online_path.FSCHED = command
    with tempfile.TemporaryDirectory() as tmp:
        f = online_path.Fsched(engine, backend, Path(tmp), 1, link=True)
        try:
            online_path.warm_up(f.urls, f.key, "fsched")
            done = time.monotonic()
            pid = f.servers[0].pid
            a = run_time_ns(pid)
            time.sleep(seconds)
            b = run_time_ns(pid)
            time.sleep(max(0.0, done + later - time.monotonic()))
            c = run_time_ns(pid)
            time.sleep(seconds)
            d = run_time_ns(pid)
            return (b - a) / 1e6 / seconds, (d - c) / 1e6 / seconds
        finally:
            f.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--later", type=float, default=11.0,
                        help="seconds after the requests: when the later window starts")
    args = parser.parse_args()
    found: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, Engine(256, 20.0) as engine:
        commands = [online_ab.launcher(tree, Path(tmp) / str(i)) for i, tree in enumerate(args.trees)]
        for rep in range(args.reps):
            for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
                for backend in args.backends:
                    got = idle_ms_per_s(engine, commands[i], backend, args.seconds, args.later)
                    found.setdefault((i, backend), []).append(got)
                    print(f"{args.trees[i]} {backend}: {got[0]:.2f} ms/s right after, {got[1]:.2f} later",
                          flush=True)
    print("\n| tree | backend | serve CPU ms/s, right after requests | later |\n|---|---|---|---|")
    for (i, backend), runs in sorted(found.items()):
        print(f"| {args.trees[i]} | {backend} | {', '.join(f'{r[0]:.1f}' for r in runs)} "
              f"| {', '.join(f'{r[1]:.1f}' for r in runs)} |")


if __name__ == "__main__":
    main()
