"""A small pool of isolated worker processes, each job bounded by the wall clock as well.

A worker is a fresh interpreter (`python -m fsched.core.grammar.worker`, started with
`subprocess`: nothing of the parent's state, no fork of a threaded server), talking over two pipes.
A job that crashes its worker (a segfault in the grammar library, its memory or stack budget),
overruns its CPU time or the wall-clock bound, is a `GrammarError` saying which; that worker is
killed and a fresh one takes its place on the next job. Callers block (a thread, never an event
loop); jobs beyond the pool's size wait for a free worker.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

from fsched.core.grammar.source import GrammarError, GrammarSource
from fsched.core.grammar.worker import READY


@dataclass(slots=True, frozen=True)
class WorkerBudget:
    # CPU time of one job: a 5,000-property schema takes about 1.5 s; what takes longer is refused.
    cpu_s: float = 10.0
    # Wall clock of one job: the CPU budget, with room for a worker that waits on a busy CPU (it
    # runs at a lower priority than the server: worker.py).
    wall_s: float = 30.0
    # Address space: the grammar library's lexer takes at most ~500 MB at its own default limits.
    memory_bytes: int = 2 << 30
    # The main thread's stack: the default on Linux; the daemon compiles with a larger one (llg.py).
    stack_bytes: int = 8 << 20
    start_s: float = 30.0  # a fresh interpreter's start, on a loaded machine
    workers: int = 2

    def __post_init__(self) -> None:
        if min(self.wall_s, self.cpu_s, self.start_s) <= 0 or min(self.memory_bytes, self.stack_bytes) <= 0:
            raise ValueError("every budget must be positive")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")


class _Worker:
    def __init__(self, budget: WorkerBudget):
        job_r, job_w = os.pipe()
        ans_r, ans_w = os.pipe()
        args = [sys.executable, "-m", "fsched.core.grammar.worker", str(job_r), str(ans_w),
                str(budget.cpu_s), str(budget.memory_bytes), str(budget.stack_bytes)]
        self.proc = subprocess.Popen(args, pass_fds=(job_r, ans_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(job_r)
        os.close(ans_w)
        self.jobs = Connection(job_w, readable=False)
        self.answers = Connection(ans_r, writable=False)
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if not self.answers.poll(timeout) or self.answers.recv_bytes() != READY:
            raise OSError("the grammar worker did not start")
        self.ready = True

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.jobs.close()
        self.answers.close()


class WorkerPool:
    """`compile(source)`: the llguidance grammar text, or GrammarError; safe to call from many threads."""

    def __init__(self, budget: WorkerBudget = WorkerBudget()):
        self.budget = budget
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(budget.workers):
            self._idle.put(None)  # started on first use
        self.replaced = 0

    def compile(self, source: GrammarSource) -> str:
        worker = self._idle.get()
        try:
            if worker is None:
                worker = _Worker(self.budget)
                worker.wait_ready(self.budget.start_s)
            verdict = self._run(worker, source)
        except BaseException:
            if worker is not None:
                worker.kill()
                self.replaced += 1
            worker = None
            raise
        finally:
            self._idle.put(worker)
        if "error" in verdict:
            raise GrammarError(verdict["error"])
        return verdict["grammar"]

    def _run(self, worker: _Worker, source: GrammarSource) -> dict:
        try:
            worker.jobs.send_bytes(json.dumps({"kind": source.kind.value, "text": source.text}).encode())
            if worker.answers.poll(self.budget.wall_s):
                return json.loads(worker.answers.recv_bytes())
        except (EOFError, OSError):  # it died: its exit status says how
            try:
                worker.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        raise GrammarError(self._why(worker, source))

    def _why(self, worker: _Worker, source: GrammarSource) -> str:
        code = worker.proc.poll()
        if code is None:
            return f"compiling the {source.kind.label} took longer than {self.budget.wall_s:g} s"
        if code == -signal.SIGXCPU:
            return f"compiling the {source.kind.label} took more than {self.budget.cpu_s:g} s of CPU time"
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        b = self.budget
        budget = f"{b.memory_bytes >> 20} MiB of memory, {b.stack_bytes >> 20} MiB of stack"
        return f"the grammar library crashed on the {source.kind.label} ({how}; its budget: {budget})"

    def close(self) -> None:
        while not self._idle.empty():
            worker = self._idle.get_nowait()
            if worker is not None:
                worker.kill()
