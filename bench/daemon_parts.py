"""Where `fsched daemon`'s CPU goes, part by part, in front of the paced engine (the online path).

    .venv/bin/python bench/daemon_parts.py [TREE ...] [--seconds 20] [--rounds 24] [--concurrency 32]
        [--step-ms 20] [--tokens 64]

For each source tree in turn (default: this one; `git archive REV | tar -x -C DIR` makes another),
bench/online_path.py's fsched arm runs its load (32 streamed chats of `--tokens` tokens, 64 by default,
SQLite) and, for `--seconds` in the middle of it, the daemon times its own parts: a `sitecustomize` put
on the daemon's path (and on no other process's) wraps the loop's methods (a turn, the engine's step,
the runner's reads, the push, the writer, the transaction, the sync...) in reads of the thread's CPU
clock (`CLOCK_THREAD_CPUTIME_ID`), from a signal on. Printed per tree: each part's CPU a turn and a
token, inclusive (a part's figure holds the parts it calls), and calls a turn. Each timed call costs
about 1 µs of its own, so compare trees, not the figures with an untimed run's. Thread CPU, unlike
py-spy's samples (a thread waiting for a core counts as running there) or a `SIGPROF` sampler (whose
ticks can fall in step with the engine's), is what the part spent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fast_path  # noqa: E402
import online_ab  # noqa: E402
import online_path  # noqa: E402

# (module, class or None for a module function, names): what the daemon times.
PARTS = [
    ("fsched.core.daemon.loop", "Daemon", ["_one_pass", "turn", "sync", "claim", "_beat", "_write_step"]),
    ("fsched.core.daemon.engine", "Engine", ["step"]),
    ("fsched.core.sched.scheduler", "Scheduler", ["schedule", "postprocess"]),
    ("fsched.core.runners.remote", "RemoteRunner", ["run", "_open", "_take", "_deliver", "text"]),
    ("fsched.core.runners.streams", "Streams", ["poll", "pause"]),
    ("fsched.core.daemon.publish", "Publisher", ["step", "written"]),
    ("fsched.core.daemon.link", "LinkServer", ["send", "take_wake"]),
    ("fsched.core.daemon.writer", "Writer", ["write_step", "after_step"]),
    ("fsched.storage.sql_queue", "SqlQueueStore", ["write_step", "claim", "may_have_changed", "heartbeat"]),
    ("fsched.storage.sql_queue", None, ["write_tokens", "write_completions", "lease_requests", "move_jobs"]),
    ("fsched.storage.direct", None, ["begin_immediate"]),
    ("fsched.storage.claim", None, ["_wants", "_queued_rows", "claimed_request", "read_logprobs"]),
    ("fsched.storage.sql_queue", None, ["nothing_to_take"]),
    ("fsched.storage.direct", "Tx", ["rows", "run", "many"]),
]

TIMERS = '''
import os, signal, sys, time, json
if os.environ.get("BENCH_DAEMON_PARTS"):
    _clock, _acc, _orig = time.thread_time_ns, {}, {}

    def _wrap(name, fn):
        acc = _acc.setdefault(name, [0, 0])

        def timed(*args, **kwargs):
            start = _clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += _clock() - start
                acc[1] += 1
        return timed

    def _start(signum, frame):
        for module, owner, names in PARTS:
            holder = sys.modules[module] if owner is None else getattr(sys.modules[module], owner)
            for name in names:
                fn = holder.__dict__.get(name)
                if fn is not None:  # a tree without it: left out
                    _orig[(holder, name)] = fn
                    setattr(holder, name, _wrap(f"{owner or module.rsplit('.', 1)[1]}.{name}", fn))
        _acc["cpu"] = [time.process_time_ns(), 0]

    def _stop(signum, frame):
        for (holder, name), fn in _orig.items():
            setattr(holder, name, fn)
        _acc["cpu"][0] = time.process_time_ns() - _acc["cpu"][0]
        with open(os.environ["BENCH_DAEMON_PARTS"], "w") as out:
            json.dump(_acc, out)

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
'''


def timed_launcher(tree: Path, folder: Path) -> str:
    """online_ab's `fsched` command for `tree`, with the timers' sitecustomize first on its path."""
    command = online_ab.launcher(tree, folder / "launch")
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"PARTS = {PARTS!r}\n{TIMERS}")
    path = Path(command)
    path.write_text(path.read_text().replace("PYTHONPATH=", f"PYTHONPATH={site}:"))
    return command


def one_tree(engine: fast_path.Engine, tree: Path, args) -> dict:
    """The daemon's parts while the load runs: {part: [ns, calls]}, with the load's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "parts.json"
        fast_path.FSCHED = online_path.FSCHED = timed_launcher(tree, Path(tmp))
        os.environ["BENCH_DAEMON_PARTS"] = str(out)  # the table's environment passes it on (not FSCHED_*)
        f = online_path.Fsched(engine, "sqlite", Path(tmp), 1, link=True)
        try:
            online_path.warm_up(f.urls, f.key, "fsched")
            load = os.getloadavg()[0]
            timer = _signals(f.daemon.pid, args.seconds)
            got = online_path.load(f.urls, f.key, "fsched", args.concurrency, args.rounds, args.tokens)
            timer.join()
            parts = json.loads(out.read_text())
        finally:
            f.close()
            del os.environ["BENCH_DAEMON_PARTS"]
    return {"parts": parts, "tok_s": got["tok_s"], "errors": got["errors"], "load1": round(load, 2)}


def _signals(pid: int, seconds: float):
    """A thread that starts the daemon's timers a second into the load and stops them `seconds` on."""
    import threading

    def run() -> None:
        time.sleep(1.0)
        os.kill(pid, signal.SIGUSR1)
        time.sleep(seconds)
        os.kill(pid, signal.SIGUSR2)
        time.sleep(0.5)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def report(tree: Path, got: dict, seconds: float) -> None:
    parts = got["parts"]
    turns = max(1, parts.get("Daemon.turn", [0, 0])[1])
    tokens = got["tok_s"] * seconds  # the load runs through the timed window
    cpu_us = parts.pop("cpu")[0] / 1e3
    print(f"{tree}: {got['tok_s']} tok/s, {tokens / turns:.1f} tokens a turn, {turns / seconds:.0f} turns/s, "
          f"process {cpu_us / turns:.0f} µs a turn ({cpu_us / tokens:.1f} µs a token, timed), "
          f"load {got['load1']}, errors {got['errors']}")
    for name, (ns, calls) in sorted(parts.items(), key=lambda item: -item[1][0]):
        print(f"  {name:32s} {ns / 1e3 / turns:8.1f} µs/turn {ns / 1e3 / tokens:7.2f} µs/token "
              f"{calls / turns:6.2f} calls/turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=64,
                        help="tokens an answer (few: the request's own cost)")
    args = parser.parse_args()
    engine = fast_path.Engine(256, args.step_ms)
    try:
        for tree in args.trees:
            report(tree, one_tree(engine, tree, args), args.seconds)
    finally:
        engine.__exit__()


if __name__ == "__main__":
    main()
