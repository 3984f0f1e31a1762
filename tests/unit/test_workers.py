"""api/workers.py: forked workers kept running, replaced when they die, stopped together (real processes)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fsched.api.workers import Supervisor

pytestmark = pytest.mark.timeout(60)


def _pids(path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_for(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _stop_when(check, signum: int = signal.SIGTERM) -> threading.Thread:
    """A thread that sends this process `signum` once `check()` holds (the supervisor's run is blocking)."""
    def watch() -> None:
        _wait_for(check)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_workers_run_until_stopped_and_one_that_dies_after_serving_is_replaced(tmp_path):
    started = tmp_path / "started"

    def work(index: int, ready) -> None:
        with started.open("a") as f:
            f.write(f"{index}:{os.getpid()} ")
        ready()
        if index == 0 and sum(e.startswith("0:") for e in _pids(started)) == 1:  # the first dies serving
            _wait_for(lambda: len(_pids(started)) == 2)  # (once worker 1 is in: the count stays exact)
            os._exit(3)
        signal.pause()  # serve until the stop signal (its default action ends the process)

    said: list[str] = []
    _stop_when(lambda: len(_pids(started)) >= 3)
    status = Supervisor(2, work, said.append).run()
    entries = _pids(started)
    assert status == 0
    assert sorted(e.split(":")[0] for e in entries) == ["0", "0", "1"]  # worker 0 came back, once
    assert len({e.split(":")[1] for e in entries}) == 3
    assert any("worker 0" in line and "status 3" in line and "starting another" in line for line in said)
    for entry in entries:  # every worker reaped: none is left running
        with pytest.raises(ChildProcessError):
            os.waitpid(int(entry.split(":")[1]), os.WNOHANG)


def test_a_worker_that_fails_before_serving_stops_the_others_with_its_status(tmp_path):
    started = tmp_path / "started"

    def work(index: int, ready) -> None:
        with started.open("a") as f:
            f.write(f"{index}:{os.getpid()} ")
        if index == 1:
            _wait_for(lambda: len(_pids(started)) == 2)
            raise SystemExit(7)  # as a table it cannot open would end it
        ready()
        signal.pause()

    said: list[str] = []
    began = time.monotonic()
    status = Supervisor(2, work, said.append).run()
    assert status == 7
    assert time.monotonic() - began < 10  # worker 0 was stopped, not waited for
    assert any("worker 1" in line and "before it served" in line for line in said)


def test_a_worker_that_ignores_the_stop_is_killed_after_the_grace(tmp_path, monkeypatch):
    import fsched.api.workers as workers

    monkeypatch.setattr(workers, "STOP_GRACE_S", 0.5)
    started = tmp_path / "started"

    def work(index: int, ready) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with started.open("a") as f:
            f.write(f"{index} ")
        ready()
        while True:
            signal.pause()

    _stop_when(lambda: len(_pids(started)) == 1)
    began = time.monotonic()
    assert Supervisor(1, work, lambda line: None).run() == 0
    assert time.monotonic() - began < 10
