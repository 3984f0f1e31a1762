"""The writer's batch flush beside latency work: in short transactions that yield to announced work,
within the flush plan's bound."""

from __future__ import annotations

import math

from fsched.core.daemon.holdings import Holdings
from fsched.core.daemon.writer import ROWS_PER_WRITE, Writer
from fsched.core.ports.queue import StepWritten
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass


class CountingStore:
    """Takes every token write; `writes` holds each transaction's row count."""

    def __init__(self) -> None:
        self.writes: list[int] = []

    def write_step(self, owner, updates, completions, claim=None) -> StepWritten:
        self.writes.append(len(updates))
        return StepWritten(written=len(updates))


def _writer(batch_rows: int, realtime_held: bool) -> tuple[Writer, CountingStore]:
    held = Holdings()
    for i in range(batch_rows):
        r = Request(f"b{i}", "t", RequestClass.BATCH, 10, 100, 0.0)
        r.dirty = True
        held.add(r)
    if realtime_held:
        held.add(Request("rt", "u", RequestClass.REALTIME, 10, 100, 0.0))
    store = CountingStore()
    writer = Writer(store, "d1", "m", held, lambda r: "", batch_flush_s=1.0)
    writer.flush(everything=False, now=0.0)  # the batch rows start waiting; none is due yet
    assert store.writes == []
    return writer, store


def test_a_flush_beside_latency_work_goes_in_short_transactions_and_stops_for_announced_work():
    writer, store = _writer(100, realtime_held=True)
    writer.flush(everything=False, now=1.0, asked=lambda: True)  # a share (20 rows) is due
    assert store.writes == [ROWS_PER_WRITE]  # the rest waits for the announced work
    writer.flush(everything=False, now=1.3, asked=lambda: False)  # the next flush: oldest first
    assert store.writes[1:] == [ROWS_PER_WRITE, math.ceil(84 * 0.2) - ROWS_PER_WRITE]  # a share of 84


def test_without_latency_work_or_announcements_a_flush_is_one_transaction():
    writer, store = _writer(100, realtime_held=False)
    writer.flush(everything=False, now=1.0, asked=lambda: True)
    assert store.writes == [20]
    writer, store = _writer(100, realtime_held=True)
    writer.flush(everything=False, now=1.0)
    assert store.writes == [20]


def test_overdue_rows_are_written_whatever_is_announced():
    writer, store = _writer(100, realtime_held=True)
    writer.flush(everything=False, now=2.5, asked=lambda: True)  # every row waited past the bound
    assert store.writes == [100]
