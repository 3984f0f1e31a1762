"""`fsched serve --workers N`: N server processes on one listening socket, and the process that keeps them.

A server is one event loop: it reads, parses and answers every request in
turn, and when many arrive at once (streams that end in the same engine step
and their clients' next requests) the last waits for all the others. Worker
processes share the port (the socket is bound once, before they are forked,
and each accepts from it: an idle worker takes a new connection first), so
a burst is read by several loops at once. A server keeps nothing of its own
between requests (the table is the record), so any worker may answer any
request.

The supervisor forks the workers, passes a stop (SIGTERM, or SIGINT: the
workers have a process group of their own, so a terminal's Ctrl-C reaches
the supervisor alone, which passes it on once) and waits for them. A worker
that dies after it began serving is replaced; one that exits before (a
database it cannot open, a port it cannot use) stops the others, and its
exit status is the command's. A worker whose supervisor is killed gets
SIGTERM (Linux's parent-death signal), so no worker outlives it holding
the port.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

POLL_S = 0.2  # how often the supervisor looks for a worker that ended (it waits on their pipes meanwhile)
STOP_GRACE_S = 20.0  # a worker still running this long after the stop is killed
PR_SET_PDEATHSIG = 1  # prctl(2)

# work(index, ready): serve as worker `index`, calling `ready()` once it accepts connections
Work = Callable[[int, Callable[[], None]], None]


@dataclass
class _Worker:
    index: int
    ready_fd: int  # the read end of the pipe the worker writes a byte to once it serves
    ready: bool = False


class Supervisor:
    """Runs `count` workers until a stop signal or a worker that fails to start; `run` returns the exit
    status for the command."""

    def __init__(self, count: int, work: Work, say: Callable[[str], None]):
        self.count, self.work, self.say = count, work, say
        self.workers: dict[int, _Worker] = {}  # by pid
        self.stopping_since: float | None = None
        self.status = 0

    def run(self) -> int:
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for index in range(self.count):
                self._start(index)
            while self.workers:
                self._wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return self.status

    def _start(self, index: int) -> None:
        read_fd, write_fd = os.pipe()
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            os.close(read_fd)
            _worker_main(index, self.work, write_fd, supervisor)
        os.close(write_fd)
        self.workers[pid] = _Worker(index, read_fd)

    def _stop(self, signum: int, _frame=None) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self._signal_all(signum)

    def _signal_all(self, signum: int) -> None:
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _wait(self) -> None:
        """Hear which workers began serving, then reap those that ended (POLL_S at most)."""
        waiting = {w.ready_fd: w for w in self.workers.values() if not w.ready}
        if waiting:
            readable, _, _ = select.select(list(waiting), [], [], POLL_S)
            for fd in readable:
                waiting[fd].ready = os.read(fd, 1) != b""  # nothing: it exited without serving
        else:
            time.sleep(POLL_S)
        for pid in list(self.workers):  # its own workers only: no other child's status is taken
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._ended(pid, os.waitstatus_to_exitcode(wait_status))
        if self.stopping_since is not None and time.monotonic() - self.stopping_since > STOP_GRACE_S:
            self._signal_all(signal.SIGKILL)

    def _ended(self, pid: int, code: int) -> None:
        worker = self.workers.pop(pid)
        if not worker.ready:  # its byte may have come after the last look (nothing blocks: it is gone)
            worker.ready = os.read(worker.ready_fd, 1) != b""
        os.close(worker.ready_fd)
        if self.stopping_since is not None:
            return
        if not worker.ready:
            self.say(f"worker {worker.index} (pid {pid}) {_how(code)} before it served: stopping the others")
            self.status = code if code > 0 else 1
            self._stop(signal.SIGTERM)
            return
        self.say(f"worker {worker.index} (pid {pid}) {_how(code)}: starting another")
        self._start(worker.index)


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _worker_main(index: int, work: Work, ready_fd: int, supervisor: int) -> None:
    """A forked worker's life: its own process group, the default stop signals (the server sets its own),
    `work`, then the process ends with its status (never returning into the supervisor's code)."""
    status = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent(supervisor)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)

        def ready() -> None:
            os.write(ready_fd, b"r")

        work(index, ready)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported here: nothing above this frame is the worker's
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def _die_with_parent(supervisor: int) -> None:
    """SIGTERM when the supervisor dies, however it dies (Linux); elsewhere, nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != supervisor:  # it died before the call: nobody would stop this worker
        os._exit(1)
