"""serve's CPU per online request, split into its event loop's thread and the others, two trees alternately.

    .venv/bin/python bench/request_cpu.py OLD_TREE NEW_TREE [--reps 2] [--tokens 4] [--rounds 40]
        [--step-ms 20] [--client sdk|light] [--syscalls]

Each rep runs both trees (`git archive REV | tar -x -C DIR`, or a worktree),
the order flipped every rep, each on a fresh SQLite table: the paced engine
(one token a slot every `--step-ms`), `fsched daemon` and one `fsched
serve`, and bench/online_path.py's client (32 streamed chats at once,
`--rounds` each, `--tokens` tokens an answer: short answers, so the request's
own cost is most of what serve spends). `--syscalls`: serve's write and futex system
calls a request too, counted by `strace -c` attached for the load (which slows it:
read the counts alone from such a run). `--client light`: bench/light_client.py's
raw asyncio client instead of the `openai` SDK, whose own CPU shares the two
cores (two runs of one tree gave serve 1,408 and 2,000 µs a request with the
SDK, 838 and 875 with the light client). Per run: serve's CPU per request in
ns-precise run time (`/proc/PID/task/*/schedstat`), all of it, the main
thread's (the event loop: HTTP, parsing, the stream) and the other threads'
(the group commit's transaction, the table reads), the daemon's, and the
1-minute load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fast_path  # noqa: E402
import online_ab  # noqa: E402
import online_path  # noqa: E402
from fast_path import Engine, postgres_cpu_s  # noqa: E402


def run_ns(pid: int) -> tuple[int, int]:
    """The process's run time so far (ns): its main thread's, and its other threads' together."""
    main = other = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
        if task.name == str(pid):
            main += ns
        else:
            other += ns
    return main, other


def measured(tree: str, f: online_path.Fsched, args, concurrency: int = 32, client: str = "sdk") -> dict:
    """The load once, after a warm-up (`concurrency` streams, `client` as online_path.load takes it): CPU
    per request of serve (all of it, its main thread's, the others'), of the daemon and of PostgreSQL's
    server processes; the first token's p50 and p99."""
    online_path.warm_up(f.urls, f.key, "fsched")
    time.sleep(1.0)
    pid, daemon = f.servers[0].pid, f.daemon.pid
    load = os.getloadavg()[0]
    counted = SystemCalls(pid) if args.syscalls else None
    (m0, o0), d0, p0 = run_ns(pid), sum(run_ns(daemon)), postgres_cpu_s()
    got = online_path.load(f.urls, f.key, "fsched", concurrency, args.rounds, args.tokens, client=client)
    (m1, o1), d1, p1 = run_ns(pid), sum(run_ns(daemon)), postgres_cpu_s()
    n = max(1, got["tokens"] // args.tokens)
    calls = {} if counted is None else {f"{name}_per_request": round(count / n, 2)
                                         for name, count in counted.stopped().items()}
    def per_request(ns: float) -> float:
        return round(ns / 1e3 / n, 1)

    return {"tree": tree, "requests": n, "errors": got["errors"],
            "serve_us_request": per_request(m1 - m0 + o1 - o0),
            "main_thread_us": per_request(m1 - m0), "other_threads_us": per_request(o1 - o0),
            "daemon_us_request": per_request(d1 - d0), "postgres_us_request": per_request((p1 - p0) * 1e9),
            "ttft_p50_ms": got["ttft_p50_ms"], "ttft_p99_ms": got["ttft_p99_ms"],
            "wall_s": got["wall_s"], "load1": round(load, 2), **calls}


class SystemCalls:
    """`strace -c` attached to a process and its threads from now until `stopped`: the calls of the kinds
    that write to a socket or a file, and the threads' hand-overs of the interpreter (futex), by name. The
    tracing slows the process: read the counts, not that run's CPU or first token."""

    KINDS = ("write", "writev", "sendto", "sendmsg", "futex")

    def __init__(self, pid: int):
        self.out = Path(tempfile.mkdtemp()) / "strace.txt"
        self.proc = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(self.out)],
                                     stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached to every thread before the load

    def stopped(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)
        counts = {}
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in self.KINDS:
                counts[parts[-1]] = int(parts[3])
        shutil.rmtree(self.out.parent)
        return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--client", choices=("sdk", "light"), default="sdk")
    parser.add_argument("--syscalls", action="store_true",
                        help="count serve's writes and futex calls a request (strace -c; slows the run)")
    args = parser.parse_args()
    engine = Engine(256, args.step_ms)
    rows: dict[str, list] = {str(t): [] for t in args.trees}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            commands = [online_ab.launcher(t, Path(tmp) / str(i)) for i, t in enumerate(args.trees)]
            for rep in range(args.reps):
                order = list(range(len(args.trees)))
                if rep % 2:
                    order.reverse()
                for i in order:
                    fast_path.FSCHED = online_path.FSCHED = commands[i]
                    with tempfile.TemporaryDirectory() as folder:
                        f = online_path.Fsched(engine, "sqlite", Path(folder), 1, link=True)
                        try:
                            row = measured(str(args.trees[i]), f, args, client=args.client)
                        finally:
                            f.close()
                    rows[row["tree"]].append(row)
                    print(json.dumps(row), flush=True)
    finally:
        engine.__exit__()
    for tree, runs in rows.items():
        print(tree, "serve µs/request", [r["serve_us_request"] for r in runs], "main thread",
              [r["main_thread_us"] for r in runs], "other threads", [r["other_threads_us"] for r in runs],
              "load", [r["load1"] for r in runs])


if __name__ == "__main__":
    main()
