"""A small pool of isolated worker processes, each job bounded by the wall clock as well.

A worker is a fresh interpreter (`python -m fsched.core.grammar.worker`, started with
`subprocess`: nothing of the parent's state, no fork of a threaded server), talking over two pipes.
A job that crashes its worker (a segfault in the grammar library, its memory or stack budget),
overruns its CPU time or the wall-clock bound, is a `GrammarError` saying which; that worker is
killed and a fresh one takes its place on the next job. Callers block (a thread, never an event
loop); jobs beyond the pool's size wait for a free worker, in turn by tenant (`fairness.py`): one
tenant's queue of expensive schemas never stands before another tenant's check, and a tenant with its
most jobs waiting has the next refused at once (`GrammarBusy`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection

from fsched.core.grammar.fairness import FairQueue, TenantQueueFull
from fsched.core.grammar.source import GrammarBusy, GrammarError, GrammarSource
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
    # Jobs one tenant may have waiting for a worker (beyond the ones running): its next is refused.
    waiting_per_tenant: int = 4

    def __post_init__(self) -> None:
        if min(self.wall_s, self.cpu_s, self.start_s) <= 0 or min(self.memory_bytes, self.stack_bytes) <= 0:
            raise ValueError("every budget must be positive")
        if self.workers < 1 or self.waiting_per_tenant < 1:
            raise ValueError("workers and waiting_per_tenant must be at least 1")


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


class _Turn:
    """One caller waiting for a worker: the one it is handed (None: to be started), once granted."""

    __slots__ = ("granted", "worker")

    def __init__(self) -> None:
        self.granted = False
        self.worker: _Worker | None = None


class WorkerPool:
    """`compile(source, tenant)`: the llguidance grammar text, or GrammarError; safe to call from many
    threads."""

    def __init__(self, budget: WorkerBudget = WorkerBudget()):
        self.budget = budget
        self._lock = threading.Condition()
        self._idle: list[_Worker | None] = [None] * budget.workers  # None: started on first use
        self._waiting: FairQueue[_Turn] = FairQueue(budget.waiting_per_tenant)
        self.replaced = 0

    def compile(self, source: GrammarSource, tenant: str = "") -> str:
        worker = self._take(tenant, source)
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
            self._give_back(worker)
        if "error" in verdict:
            raise GrammarError(verdict["error"])
        return verdict["grammar"]

    def waiting(self, tenant: str) -> int:
        """The tenant's jobs waiting for a worker now."""
        with self._lock:
            return self._waiting.waiting(tenant)

    def _take(self, tenant: str, source: GrammarSource) -> _Worker | None:
        """A worker for the tenant's job, once its turn comes."""
        turn = _Turn()
        with self._lock:
            try:
                self._waiting.push(tenant, turn)
            except TenantQueueFull:
                raise GrammarBusy(f"{self.budget.waiting_per_tenant} of this tenant's {source.kind.label}s "
                                  "are already waiting to be checked; send it again once they are "
                                  "answered") from None
            self._hand_out()
            try:
                while not turn.granted:
                    self._lock.wait()
            except BaseException:
                self._waiting.remove(tenant, turn)
                if turn.granted:
                    self._idle.append(turn.worker)
                    self._hand_out()
                raise
        return turn.worker

    def _give_back(self, worker: _Worker | None) -> None:
        with self._lock:
            self._idle.append(worker)
            self._hand_out()

    def _hand_out(self) -> None:
        """Idle workers to the callers whose turn it is (the lock held)."""
        while self._idle and (turn := self._waiting.pop()) is not None:
            turn.worker, turn.granted = self._idle.pop(), True
        self._lock.notify_all()

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
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            if worker is not None:
                worker.kill()
