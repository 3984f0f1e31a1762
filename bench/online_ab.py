"""fsched's CPU per streamed token, two source trees alternately, one engine for every run.

    .venv/bin/python bench/online_ab.py OLD_TREE NEW_TREE [--reps 3] [--concurrency 32] [--rounds 4]
        [--tokens 64] [--step-ms 20] [--vllm] [--backend sqlite] [--stamps] [--client sdk|light]

A tree is a folder of fsched's sources (`git archive REV | tar -x -C DIR`,
or a worktree); its `fsched daemon` and `fsched serve` run from it, with
this environment's packages. Each rep runs both trees, in turn, the order
flipped every rep (ABBA...), each on a fresh table (SQLite, or `--backend postgresql`): bench/online_path.py's
fsched arm (its client, 32 streamed chats by default, warm-up first) in
front of the paced engine, or with `--vllm` vLLM's CPU build started once
with `--tokens-only` (the daemon on `--engine-api tokens`). Each run prints
a row: tok/s, the CPU per token of the daemon and the server (user and
system; voluntary and involuntary context switches per token, all threads),
of the engine's API server process, the daemon's tokens per step (from its
heartbeat's step count) and the 1-minute load average at the start; then
each tree's figures side by side. CPU per token falls as tokens per step
and tok/s rise (per-step and per-second costs): compare rows at like
figures. `--stamps`: each run's requests also timed stage by stage (bench/online_path.py's
`--stamps`: the client's call, the server's handler, the group commit, the claim, the engine...),
each stage's p50 / p99 printed for each tree, and the way in (from the server's reading of the
request's head to its stream to the engine opened). `--client light`: bench/online_path.py's
light client instead of the `openai` SDK. Each tree's first token p50 and p99 are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fast_path  # noqa: E402
import online_path  # noqa: E402
from fast_path import TICK, Engine, cpu_s  # noqa: E402


def package_of(tree: Path, folder: Path) -> Path:
    """A folder, made in `folder`, that holds the sources in `tree` as package `fsched` (for PYTHONPATH)."""
    package = folder / "pkg"
    package.mkdir(parents=True)
    (package / "fsched").symlink_to(tree.resolve())
    return package


def launcher(tree: Path, folder: Path) -> str:
    """An `fsched` command running the sources in `tree` (as package `fsched`) with this interpreter."""
    package = package_of(tree, folder)
    path = folder / "fsched"
    code = 'import sys; sys.argv[0] = "fsched"; from fsched.cli.main import app; sys.exit(app())'
    path.write_text(f"#!/bin/sh\nPYTHONPATH={package} exec {sys.executable} -c '{code}' \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def figures(pid: int) -> tuple[float, float, int, int]:
    """(user s, system s, voluntary, involuntary context switches) of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        except OSError:
            continue
    return int(fields[11]) / TICK, int(fields[12]) / TICK, voluntary, involuntary


def one_run(engine, command: str, args) -> dict:
    fast_path.FSCHED = online_path.FSCHED = command
    vllm = isinstance(engine, online_path.Vllm)
    with tempfile.TemporaryDirectory() as tmp:
        stamps = Path(tmp) / "stamps" if args.stamps else None
        f = online_path.Fsched(engine, args.backend, Path(tmp), 1, link=True, stamps=stamps)
        try:
            model = f.served_model() if vllm else "fsched"
            online_path.warm_up(f.urls, f.key, model)

            def steps() -> int:
                raw = f.table.query("SELECT stats FROM daemons")[0]
                return (json.loads(raw) if isinstance(raw, str) else raw).get("steps", 0)

            time.sleep(1.2)  # the warm-up's steps in a heartbeat
            pids = {"daemon": f.daemon.pid, "serve": f.servers[0].pid}
            steps0, load = steps(), os.getloadavg()[0]
            before = {name: figures(pid) for name, pid in pids.items()}
            api0 = engine.api_cpu_s() if vllm else cpu_s(engine.proc.pid)
            began = time.time()
            got = online_path.load(f.urls, f.key, model, args.concurrency, args.rounds, args.tokens,
                                   tagged=stamps is not None, client=args.client)
            ended = time.time()
            times = got.pop("client_times", None)
            n = max(1, got["tokens"])
            api = engine.api_cpu_s() if vllm else cpu_s(engine.proc.pid)
            row = {"tokens": got["tokens"], "errors": got["errors"], "tok_s": got["tok_s"],
                   "ttft_p50_ms": got["ttft_p50_ms"], "ttft_p99_ms": got["ttft_p99_ms"],
                   "load1": round(load, 2),
                   "engine_api_us": round(1e6 * (api - api0) / n, 1)}
            for name, pid in pids.items():
                a, b = before[name], figures(pid)
                row[name] = {"us": round(1e6 * (b[0] + b[1] - a[0] - a[1]) / n, 1),
                             "usr": round(1e6 * (b[0] - a[0]) / n, 1),
                             "sys": round(1e6 * (b[1] - a[1]) / n, 1),
                             "vcsw": round((b[2] - a[2]) / n, 3), "icsw": round((b[3] - a[3]) / n, 3)}
            time.sleep(1.2)  # the load's last steps in a heartbeat
            row["tok_per_step"] = round(n / max(1, steps() - steps0), 2)
            if stamps is not None:
                staged = online_path.stage_figures(stamps, began, ended, times)
                row["stages"] = staged["p50/p99 ms"]
                row["way_in"] = staged["way in"]["arrived>opened"]
            return row
        finally:
            f.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--engine-nice", type=int, default=10)
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--stamps", action="store_true",
                        help="each run's online requests timed stage by stage (core/stamps.py), p50 / p99 "
                             "ms, and their way in (the server's head to the engine's stream opened)")
    parser.add_argument("--client", default="sdk", choices=["sdk", "light"],
                        help="as bench/online_path.py's --client")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        commands = [launcher(tree, Path(tmp) / str(i)) for i, tree in enumerate(args.trees)]
        if args.vllm:
            log = Path(tempfile.gettempdir()) / f"online_ab-vllm-{os.getpid()}.log"
            engine = online_path.Vllm(args.concurrency, args.engine_nice, log, engine_api="tokens")
        else:
            engine = Engine(256, args.step_ms)
        rows: list[tuple[int, dict]] = []
        try:
            for rep in range(args.reps):
                for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
                    row = one_run(engine, commands[i], args)
                    rows.append((i, row))
                    print(json.dumps({"tree": str(args.trees[i]), **row}), flush=True)
        finally:
            if args.vllm:
                engine.server.stop()
            else:
                engine.__exit__()
    for i, tree in enumerate(args.trees):
        mine = [row for j, row in rows if j == i]
        print(f"{tree}: daemon {[r['daemon']['us'] for r in mine]} serve {[r['serve']['us'] for r in mine]} "
              f"µs/token; tok/s {[r['tok_s'] for r in mine]}; tok/step {[r['tok_per_step'] for r in mine]}; "
              f"load {[r['load1'] for r in mine]}")
        print(f"  first token p50 {[r['ttft_p50_ms'] for r in mine]} (median {_median(mine, 'ttft_p50_ms')}) "
              f"p99 {[r['ttft_p99_ms'] for r in mine]} (median {_median(mine, 'ttft_p99_ms')}) ms")
        if args.stamps:
            ways = [float(r["way_in"].split("/")[0]) for r in mine]
            print(f"  way in p50 {ways} (median {statistics.median(ways)}) ms")
            for stage in mine[0]["stages"]:
                print(f"  {stage} p50 / p99 ms: {[r['stages'].get(stage) for r in mine]}")


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


if __name__ == "__main__":
    main()
