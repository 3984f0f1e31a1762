"""The writer's batch flush: a due share spread over the daemon's turns in short transactions (SQLite's
write lock free between them), within the flush plan's bound."""

from __future__ import annotations

import math

import pytest

from fsched.core.daemon.holdings import Holdings
from fsched.core.daemon.writer import ROWS_PER_WRITE, Writer, kept_of
from fsched.core.ports.queue import StepWritten
from fsched.core.ports.records import StorageError
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass


class CountingStore:
    """Takes every token write; `writes` holds each transaction's row count."""

    def __init__(self) -> None:
        self.writes: list[int] = []

    def write_step(self, owner, updates, completions, claim=None) -> StepWritten:
        self.writes.append(len(updates))
        return StepWritten(written=len(updates))


def _writer(batch_rows: int, realtime_held: bool = False) -> tuple[Writer, CountingStore]:
    held = Holdings()
    for i in range(batch_rows):
        held.add(Request(f"b{i}", "t", RequestClass.BATCH, 10, 100, 0.0))
    held.produced([f"b{i}" for i in range(batch_rows)])  # a step's tokens: their output waits
    if realtime_held:
        held.add(Request("rt", "u", RequestClass.REALTIME, 10, 100, 0.0))
    store = CountingStore()
    writer = Writer(store, "d1", "m", held, lambda r: "", batch_flush_s=1.0)
    writer.flush(everything=False, now=0.0)  # the batch rows start waiting; none is due yet
    assert store.writes == []
    return writer, store


def _turns(writer: Writer, start: float, end: float, turn_s: float) -> None:
    steps = round((end - start) / turn_s)
    for i in range(steps + 1):
        writer.after_step(start + i * turn_s)


def test_a_due_share_goes_out_over_the_turns_in_short_transactions():
    for realtime_held in (False, True):
        writer, store = _writer(100, realtime_held)
        _turns(writer, 1.0, 1.18, 0.02)  # a share (20 rows) is due at 1.0; turns every 20 ms
        assert store.writes == [ROWS_PER_WRITE, 20 - ROWS_PER_WRITE]  # not one transaction of 20


def test_a_large_share_is_written_before_the_next_is_due_at_the_turns_pace():
    writer, store = _writer(1000)
    _turns(writer, 0.70, 0.78, 0.02)  # turns every 20 ms; no row has waited long enough yet
    assert store.writes == []
    _turns(writer, 0.80, 0.98, 0.02)  # a share of 200 due at 0.8, the next at 1.0
    assert sum(store.writes) == 200
    assert max(store.writes) <= math.ceil(200 / 10) + 1  # about a tenth a turn, not all at once
    assert len(store.writes) >= 9


def test_each_row_is_written_once_a_period_however_the_share_is_spread():
    writer, store = _writer(100)
    _turns(writer, 0.02, 3.0, 0.02)
    assert sum(store.writes) == 100  # every row once by 1.8 s (every_s 1 s, rows all dirty once)


def test_overdue_rows_are_written_at_once():
    writer, store = _writer(100)
    writer.flush(everything=False, now=2.5)  # every row waited past the bound
    assert store.writes == [100]


def test_a_final_flush_writes_everything_at_once():
    writer, store = _writer(100)
    writer.after_step(1.0)
    writer.flush(everything=True, now=1.06)
    assert sum(store.writes) == 100
    assert store.writes[-1] == 100 - store.writes[0]


def test_the_share_being_written_is_the_loops_next_duty():
    writer, store = _writer(100)
    writer.after_step(1.0)
    assert store.writes == [ROWS_PER_WRITE]
    assert writer.next_flush_at() == 1.0  # the rest of the share goes at the next turn
    _turns(writer, 1.02, 1.1, 0.02)
    assert writer.next_flush_at() >= 1.2  # the share written: the plan's next flush


def test_a_row_of_the_share_written_or_ended_meanwhile_is_left_out():
    writer, store = _writer(1000)
    _turns(writer, 0.70, 0.82, 0.02)  # a share of 200 due at 0.8: its first parts written
    first = sum(store.writes)
    rest = [writer.holdings.get(rid) for rid in writer._spread]
    assert first and len(rest) == 200 - first
    writer.write_now(rest[:2])  # shown to someone: written at once
    writer.holdings.pop(rest[2].id)  # ended
    writer.after_step(1.05)  # the next share comes due while the last one is being written
    assert store.writes[-2] == 2
    writer.flush(everything=True, now=1.06)
    assert sum(store.writes) == 1000 - 1  # each row once, the ended one not at all


def test_a_write_says_how_much_of_its_text_the_table_holds_already():
    assert kept_of(None, "abc") is None  # the first write after a claim: the table's text is not known
    assert kept_of("ab", "abc") == 2
    assert kept_of("ab\ufffd", "ab\u00e9!") == 2  # a character whose bytes had not all come, now whole
    assert kept_of("abc", "abc") == 3


class RowsStore:
    """Keeps the request ids of each transaction's token rows; fails the next one when told to."""

    def __init__(self) -> None:
        self.writes: list[list[str]] = []
        self.fail_next = False

    def write_step(self, owner, updates, completions, claim=None) -> StepWritten:
        if self.fail_next:
            self.fail_next = False
            raise StorageError("the table is locked")
        self.writes.append([u.request_id for u in updates])
        return StepWritten(written=len(updates))


def _stepping(*requests: Request) -> tuple[Holdings, Writer, RowsStore]:
    held = Holdings()
    for r in requests:
        held.add(r)
    store = RowsStore()
    return held, Writer(store, "d1", "m", held, lambda r: "", batch_flush_s=1.0), store


def test_a_latency_class_request_is_written_the_step_it_produced_and_not_again_until_it_does():
    rt, batch = Request("rt", "u", RequestClass.REALTIME, 10, 100, 0.0), Request("b", "t", RequestClass.BATCH,
                                                                                 10, 100, 0.0)
    held, writer, store = _stepping(rt, batch)
    held.produced(["rt", "b"])
    writer.write_step()
    writer.after_step(0.0)
    assert store.writes == [["rt"]]  # the batch row waits for its share
    writer.write_step()
    writer.after_step(0.02)
    assert store.writes == [["rt"]]  # nothing new: nothing written
    held.produced(["rt"])
    writer.write_step()
    assert store.writes == [["rt"], ["rt"]]


def test_a_failed_write_is_tried_again_at_the_next_step_without_new_tokens():
    rt = Request("rt", "u", RequestClass.REALTIME, 10, 100, 0.0)
    held, writer, store = _stepping(rt)
    held.produced(["rt"])
    store.fail_next = True
    with pytest.raises(StorageError):
        writer.write_step()
    assert rt.dirty
    writer.write_step()
    assert store.writes == [["rt"]] and not rt.dirty


def test_a_request_linked_or_unlinked_as_it_produces_is_filed_by_what_it_is_then():
    rt = Request("rt", "u", RequestClass.REALTIME, 10, 100, 0.0)
    held, writer, store = _stepping(rt)
    rt.linked = True  # a server hears it over the link: its tokens go with the batch writes
    held.produced(["rt"])
    writer.write_step()
    writer.after_step(0.0)
    assert store.writes == []
    rt.linked = False  # the server went away: the table is how its client hears it again
    held.produced(["rt"])
    writer.write_step()
    assert store.writes == [["rt"]]


def test_a_request_that_ended_before_its_write_is_not_written():
    rt = Request("rt", "u", RequestClass.REALTIME, 10, 100, 0.0)
    held, writer, store = _stepping(rt)
    held.produced(["rt"])
    held.pop("rt")
    writer.write_step()
    writer.flush(everything=True, now=0.0)
    assert store.writes == []
