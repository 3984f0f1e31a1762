"""The long chaos loop: random kills for as long as asked (`pytest tests/chaos --long SECONDS`).

Each round takes a fresh job table and a random workload (explicit seeds, three
tenants and classes), then kills the stand-in daemon several times, each way at
random: a named crash point at a random depth, kill -9 or SIGTERM after a random
delay (random batch size and policy), a submit killed inside its transaction, a
job cancelled under the daemon. After every kill it checks the table's
invariants (harness.check_table); at the end of the round an unarmed daemon
finishes the work and every output must equal the reference, computed here
by the engine on the stand-in without any daemon or database. One line per
round, a summary at the end; `--chaos-seed N` replays a run.
"""

from __future__ import annotations

import random
import shutil
import signal
import sqlite3
import time
from collections import Counter
from functools import partial

from fsched.core.daemon.engine import Engine
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.runners.standin import StandInRunner, standin_encode
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler

from .harness import (
    SIGKILLED,
    JobFile,
    Table,
    check_table,
    outputs,
    submit,
    wait_for,
    write_job_file,
    write_workload,
)

DAEMON_POINTS = {"after_claim": (1, 6), "after_flush": (1, 60), "before_done_commit": (1, 60)}
POLICIES = ("fsched", "fcfs", "priority", "vtc")


def reference(files: list[JobFile]) -> dict[tuple[str, str], list[int]]:
    """What a daemon must produce: each request through the engine on the stand-in."""
    expected = {}
    for f in files:
        parsed = parse_job_file(f.path.read_bytes(), f.name)
        runner = StandInRunner()
        engine = Engine(runner, Scheduler(SchedulerConfig(max_batch=64, kv_tokens=65_536, step_tokens=4096)),
                        runner.context_length)
        requests = [
            Request.to_run(spec.custom_id, standin_encode(spec.prompt, [
                {"role": m.role, "content": m.content} for m in spec.messages] if spec.messages else None),
                spec.params)
            for spec in parsed
        ]
        for rid, result in engine.run_all(requests).items():
            expected[(f.name, rid)] = result.tokens
    return expected


class Round:
    def __init__(self, base, rng: random.Random, totals: Counter):
        self.rng, self.totals = rng, totals
        self.base = base
        seed = rng.randrange(1 << 30)
        self.files = write_workload(base / "files", seed=seed, scale=rng.uniform(0.3, 1.5))
        self.table = Table.at(base / "fsched.db")
        submit(self.table, self.files)
        self.expected = reference(self.files)
        self.snap = check_table(self.table.path, self.expected)
        self.tried: list[str] = []
        self.extra = 0

    def daemon_args(self) -> list[str]:
        return ["daemon", "--model", "standin:2ms", "--quiet", "--max-batch",
                str(self.rng.choice([4, 16, 32])), "--policy", self.rng.choice(POLICIES)]

    def check(self) -> None:
        self.snap = check_table(self.table.path, self.expected, previous=self.snap)
        self.totals["checks"] += 1

    def crash_point(self) -> bool:
        point = self.rng.choice(list(DAEMON_POINTS))
        # Deep crashes while there is much work left, shallow ones near the end of it.
        waiting = sum(self.snap.states.get(s, 0) for s in ("queued", "running", "preempted"))
        left = waiting / self.snap.requests
        low, high = DAEMON_POINTS[point]
        n = self.rng.randint(low, max(low, round(high * left)))
        proc = self.table.run(*self.daemon_args(), "--until-idle", crash_at=f"{point}:{n}", timeout=300)
        if proc.returncode == 0:  # the work ended before the point was reached
            self.tried.append(f"{point}:{n} (not reached)")
            self.totals["points not reached"] += 1
            return False
        assert proc.returncode == SIGKILLED, proc.stderr.decode()
        self.tried.append(f"{point}:{n}")
        self.totals[f"killed at {point}"] += 1
        return True

    def signal(self, sig: signal.Signals) -> bool:
        delay = self.rng.uniform(0.1, 2.5)
        daemon = self.table.start(*self.daemon_args())
        if sig == signal.SIGTERM:  # from its first heartbeat on: the handler is installed by then
            assert wait_for(lambda: self.serving(daemon.pid), timeout=30), "the daemon never started"
        time.sleep(delay)
        sent = time.monotonic()
        daemon.send_signal(sig)
        _, err = daemon.communicate(timeout=60)
        name = "kill -9" if sig == signal.SIGKILL else "SIGTERM"
        self.tried.append(f"{name} @{delay:.1f}s")
        self.totals[name] += 1
        if sig == signal.SIGTERM:
            assert daemon.returncode == 0, err.decode()
            assert time.monotonic() - sent < 5, "SIGTERM took over 5 s"
        else:
            assert daemon.returncode == SIGKILLED
        return True

    def serving(self, pid: int) -> bool:
        conn = sqlite3.connect(self.table.path, timeout=30)
        try:
            return conn.execute("SELECT 1 FROM daemons WHERE pid = ?", (pid,)).fetchone() is not None
        finally:
            conn.close()

    def killed_submit(self) -> bool:
        self.extra += 1
        path = write_job_file(self.base / "files" / f"extra{self.extra}.jsonl", self.rng.randint(1, 40),
                              seed=self.rng.randrange(1 << 30))
        extra = JobFile(path, "dave", self.rng.choice(["batch", "streaming"]), 0)
        before = (self.snap.jobs, self.snap.requests)
        proc = self.table.run("submit", str(path), "--tenant", extra.tenant, "--class", extra.request_class,
                              crash_at="mid_submit")
        assert proc.returncode == SIGKILLED and proc.stdout == b"", proc.stderr.decode()
        self.check()
        assert (self.snap.jobs, self.snap.requests) == before, "a killed submit left rows"
        submit(self.table, [extra])  # the same command again, unarmed
        self.expected.update(reference([extra]))
        self.tried.append("submit killed mid-transaction")
        self.totals["submits killed"] += 1
        return True

    def cancel(self) -> bool:
        job = self.rng.randint(1, self.snap.jobs)
        daemon = self.table.start(*self.daemon_args())
        time.sleep(self.rng.uniform(0.3, 1.5))
        self.table.ok("cancel", str(job))
        time.sleep(self.rng.uniform(0.0, 0.3))
        daemon.send_signal(self.rng.choice([signal.SIGKILL, signal.SIGTERM]))
        daemon.communicate(timeout=60)
        self.tried.append(f"cancel job {job} under the daemon, then kill it")
        self.totals["cancels"] += 1
        return True

    def finish(self) -> None:
        self.table.ok(*self.daemon_args(), "--until-idle", timeout=600)
        self.check()
        final = self.snap
        assert final.states.get("done", 0) + final.states.get("cancelled", 0) == final.requests, final.states
        done = {key: tokens for key, entries in outputs(self.table.path).items()
                for state, tokens, _ in entries if state == "done"}
        assert all(tokens == self.expected[key] for key, tokens in done.items())
        self.totals["requests"] += final.requests
        self.totals["outputs compared"] += len(done)


def test_long_chaos(long_seconds, tmp_path, request, capsys):
    seed = request.config.getoption("--chaos-seed", default=None)
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    totals: Counter = Counter()
    started = time.monotonic()

    def say(line: str) -> None:
        with capsys.disabled():
            print(line, flush=True)

    say(f"\nchaos: seed {seed} (--chaos-seed {seed} replays it), {long_seconds:.0f} s")
    round_no = 0
    while time.monotonic() - started < long_seconds:
        round_no += 1
        base = tmp_path / f"round{round_no}"
        t0 = time.monotonic()
        r = Round(base, rng, totals)
        actions = [r.crash_point] * 4 + [partial(r.signal, signal.SIGKILL)] * 2 + [
            partial(r.signal, signal.SIGTERM), r.killed_submit, r.cancel]
        for _ in range(rng.randint(2, 8)):
            try:
                if not rng.choice(actions)():
                    break
                r.check()
            except AssertionError:
                say(f"round {round_no}: FAILED after {', '.join(r.tried)} (seed {seed})")
                raise
        r.finish()
        totals["rounds"] += 1
        say(f"round {round_no}: {r.snap.requests} requests, {', '.join(r.tried)} -> invariants held after "
            f"each; final outputs = reference ({r.snap.summary()}) [{time.monotonic() - t0:.1f} s]")
        shutil.rmtree(base, ignore_errors=True)
    say(f"chaos summary: {totals['rounds']} rounds in {time.monotonic() - started:.0f} s, seed {seed}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.items()) if k != "rounds") + "; no invariant broken")
    assert totals["rounds"] >= 1
