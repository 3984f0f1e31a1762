"""A model step that raises: the daemon requeues or fails the requests in it, and serves the rest.

In-process: the real `Daemon` over a real SQLite `SqlJobStore`, the stand-in
runner raising from inside chosen steps (`StandInRunner(fail_when=...)`), as a
model raises on a bad input or runs out of memory. Each run has a watchdog: a
daemon that loops on a failing request is stopped and the test fails.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

import pytest

from fsched.core.daemon.engine import Engine
from fsched.core.daemon.loop import Daemon, DaemonConfig
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import JobSubmission
from fsched.core.runners.standin import STANDIN_NAME, StandInRunner, standin_encode
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass
from fsched.storage.jobstore import SqlJobStore

from .harness import check_table, write_job_file

MAX_BATCH = 16
WATCHDOG_S = 60


class OutOfMemoryError(RuntimeError):
    """What torch.cuda.OutOfMemoryError looks like to code that does not import torch."""


def plan_ids(plan: Plan) -> set[str]:
    return set(plan.decode) | {c.request_id for c in plan.prefill}


class Served:
    """A daemon on a fresh SQLite table with the stand-in, and what happened to it."""

    def __init__(self, tmp_path, name: str, fail_when: Callable[[Plan], BaseException | None] | None = None,
                 lines: int = 40, max_batch: int = MAX_BATCH, max_attempts: int = 3):
        self.path = tmp_path / name / "fsched.db"
        self.store = SqlJobStore(f"sqlite:///{self.path}")
        job = write_job_file(tmp_path / f"{name}.jsonl", lines, seed=11, max_tokens=(8, 40))
        parsed = parse_job_file(job.read_bytes(), job.name)
        self.store.submit([JobSubmission(parsed, "alice", RequestClass.BATCH, 5, job.name)])
        self.batches: list[int] = []  # the size of every step the runner was given
        self.failures: list[str] = []

        def fail(plan: Plan) -> BaseException | None:
            self.batches.append(len(plan_ids(plan)))
            error = fail_when(plan) if fail_when else None
            if error is not None:
                self.failures.append(f"{type(error).__name__} with {len(plan_ids(plan))} requests")
            return error

        self.runner = StandInRunner(fail_when=fail)
        config = SchedulerConfig(max_batch=max_batch, kv_tokens=32_768, step_tokens=512)
        self.scheduler = Scheduler(config, "fsched", self.store.tenant_weights())
        engine = Engine(self.runner, self.scheduler, self.runner.context_length)
        self.daemon = Daemon(
            self.store, engine, lambda c: standin_encode(c.prompt_text, c.messages),
            DaemonConfig(owner="test", host="test", pid=0, device="standin", model=STANDIN_NAME,
                         policy="fsched", max_attempts=max_attempts,
                         until_idle=True, sync_interval_s=0.01, idle_sleep_s=0.001),
        )

    def run(self) -> None:
        watchdog = threading.Timer(WATCHDOG_S, self.daemon.stop)
        watchdog.start()
        try:
            self.daemon.run()
        finally:
            watchdog.cancel()
        assert not self.daemon.stopping, (
            f"the daemon was still busy after {WATCHDOG_S} s: {len(self.failures)} failed steps")

    def rows(self) -> dict[int, tuple]:
        """id -> (state, tokens json, attempts, error)."""
        conn = sqlite3.connect(self.path)
        try:
            return {r[0]: r[1:] for r in conn.execute(
                "SELECT id, state, output_tokens, attempts, error FROM requests ORDER BY id")}
        finally:
            conn.close()


@pytest.fixture
def clean(tmp_path) -> dict[int, str]:
    """The outputs of a run without faults: request id -> tokens (json)."""
    served = Served(tmp_path, "clean")
    served.run()
    rows = served.rows()
    assert all(state == "done" for state, *_ in rows.values())
    return {rid: tokens for rid, (_, tokens, _, _) in rows.items()}


def test_a_failed_step_requeues_its_requests_and_they_finish_the_same(tmp_path, clean):
    seen = []

    def once(plan: Plan):
        seen.append(plan_ids(plan))
        return RuntimeError("transient device error") if len(seen) == 5 else None

    served = Served(tmp_path, "faulty", once)
    served.run()
    rows = served.rows()
    assert served.failures == [f"RuntimeError with {len(seen[4])} requests"]
    assert {rid: tokens for rid, (_, tokens, _, _) in rows.items()} == clean  # recomputed identically
    assert all(state == "done" for state, *_ in rows.values())
    involved = {int(rid) for rid in seen[4]}
    assert {rows[rid][2] for rid in involved} == {2}  # claimed again: the attempt is counted
    check_table(served.path)


def test_a_request_that_always_crashes_the_step_fails_alone(tmp_path, clean, caplog):
    """The poison request fails after max_attempts; the requests that shared its steps do not."""
    poison = "7"
    served = Served(tmp_path, "poison", lambda plan: RuntimeError("bad input") if poison in plan_ids(plan)
                    else None)
    with caplog.at_level(logging.WARNING, logger="fsched.daemon"):
        served.run()
    rows = served.rows()
    state, tokens, attempts, error = rows[int(poison)]
    assert state == "failed" and "bad input" in error, rows[int(poison)]
    others = {rid: row for rid, row in rows.items() if rid != int(poison)}
    assert [rid for rid, row in others.items() if row[0] != "done"] == []
    assert {rid: row[1] for rid, row in others.items()} == {rid: clean[rid] for rid in others}
    # Bounded: the batch is halved until the poison runs alone, then it fails max_attempts times.
    assert len(served.failures) <= 3 + MAX_BATCH.bit_length(), served.failures
    assert served.failures[-3:] == ["RuntimeError with 1 requests"] * 3, served.failures
    check_table(served.path)


@pytest.mark.parametrize("error", [OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   MemoryError()], ids=["cuda-oom", "host-oom"])
def test_out_of_memory_shrinks_the_batch_and_everything_finishes(tmp_path, clean, caplog, error):
    """Steps over 5 requests run out of memory: the daemon halves its batch (16 -> 8 -> 4)
    for the rest of the run, requeues without counting an attempt, and completes all."""
    served = Served(tmp_path, "oom", lambda plan: error if len(plan_ids(plan)) > 5 else None)
    with caplog.at_level(logging.WARNING, logger="fsched.daemon"):
        served.run()
    rows = served.rows()
    assert all(state == "done" for state, *_ in rows.values()), served.failures
    assert {rid: tokens for rid, (_, tokens, _, _) in rows.items()} == clean
    assert served.scheduler.config.max_batch == 4
    assert len(served.failures) == 2, served.failures  # 16 -> 8 -> 4: two out-of-memory steps
    last_oom = max(i for i, n in enumerate(served.batches) if n > 5)
    assert max(served.batches[last_oom + 1:]) <= 4
    assert "max batch 16 -> 8" in caplog.text and "max batch 8 -> 4" in caplog.text
    check_table(served.path)


def test_out_of_memory_with_one_request_alone_fails_that_request(tmp_path, clean):
    """At batch 1 there is nothing left to shrink: the request itself does not fit."""
    big = "3"
    served = Served(tmp_path, "oom-one", lambda plan: OutOfMemoryError("CUDA out of memory")
                    if big in plan_ids(plan) else None, lines=12, max_batch=4)
    served.run()
    rows = served.rows()
    state, _, _, error = rows[int(big)]
    assert state == "failed" and "out of memory" in error.lower(), rows[int(big)]
    assert all(row[0] == "done" for rid, row in rows.items() if rid != int(big))
    assert {rid: row[1] for rid, row in rows.items() if rid != int(big)} == {
        rid: clean[rid] for rid in rows if rid != int(big)}
    assert served.scheduler.config.max_batch == 1
    check_table(served.path)


def test_the_batch_limit_can_be_lowered_while_requests_run():
    """Scheduler.limit_batch: a validated config change; runners beyond it are not evicted,
    and no request is admitted until the batch is under the new limit."""
    from fsched.core.sched.request import Request

    scheduler = Scheduler(SchedulerConfig(max_batch=8, kv_tokens=32_768, step_tokens=512), "fcfs")
    for i in range(12):
        scheduler.add(Request(id=f"r{i}", tenant="t", request_class=RequestClass.BATCH, prompt_tokens=4,
                                   max_tokens=50, arrival=0.0))
    scheduler.schedule(0.0)
    assert len(scheduler.running) == 8
    scheduler.limit_batch(3)
    assert scheduler.config.max_batch == 3
    plan = scheduler.schedule(0.1)
    assert len(scheduler.running) == 8 and not plan.admitted
    for rid in list(scheduler.running)[:6]:
        scheduler.cancel(rid)
    plan = scheduler.schedule(0.2)
    assert len(scheduler.running) == 3 and len(plan.admitted) == 1
    with pytest.raises(ValueError, match="max_batch"):
        scheduler.limit_batch(0)
