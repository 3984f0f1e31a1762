"""A daemon's step written back in one transaction (`SqlQueueStore.write_step`), on SQLite and PostgreSQL:
its tokens, its completions and its claim commit together, a failure anywhere in it undoes all three,
and a value the table refuses fails its request alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import text

from fsched.core.ports.queue import ClaimAsk
from fsched.core.ports.records import Completion, TokenUpdate
from fsched.core.types import RequestStatus
from fsched.storage import direct, sql_queue, textcodec
from fsched.storage.refusals import REFUSED_PREFIX
from tests.support.tables import InSql, submission


@pytest.fixture(params=["sqlite", "postgresql"])
def table(request):
    made = InSql(request.getfixturevalue(f"{'pg' if request.param == 'postgresql' else 'sqlite'}_url"))
    yield made
    made.db.dispose()


def _a_step(table: InSql) -> tuple[list[TokenUpdate], list[Completion], ClaimAsk]:
    """alice's two requests held by d1 (one has new tokens, the other ended), bob's two queued."""
    table.catalog.submit([submission(2)])
    flushed, ended = table.queue.claim("d1", per_group=2)
    table.catalog.submit([submission(2, tenant="bob")])
    return ([TokenUpdate(flushed.id, (1, 2), "ab", lease_epoch=flushed.lease_epoch)],
            [Completion(ended.id, RequestStatus.FINISHED_STOPPED, (3,), "c", lease_epoch=ended.lease_epoch)],
            ClaimAsk(per_group=4))


def _rows(table: InSql) -> list[tuple]:
    with table.db.read() as conn:
        return [tuple(row) for row in conn.execute(text(
            "SELECT id, state, lease_owner, lease_epoch, num_output_tokens FROM requests ORDER BY id"))]


def _jobs(table: InSql) -> list[tuple]:
    with table.db.read() as conn:
        return [tuple(row) for row in conn.execute(text(
            "SELECT id, state, num_running, num_done, num_output_tokens, "
            "CASE WHEN started_at IS NULL THEN 0 ELSE 1 END FROM jobs "
            "ORDER BY id"))]


def _transactions(table: InSql) -> list[str]:
    """SQLite: the statements beginning or ending a transaction on the queue's kept connection from now
    on. PostgreSQL: the id of the transaction that last wrote each request and job row, read later."""
    if table.kind == "postgresql":
        return []
    said: list[str] = []
    table.queue.direct._connection().raw.set_trace_callback(said.append)
    return said


def _writers(table: InSql) -> set[str]:
    with table.db.read() as conn:
        return {row[0] for row in conn.execute(text(
            "SELECT xmin::text FROM requests UNION SELECT xmin::text FROM jobs"))}


def test_a_steps_tokens_completions_and_claim_are_one_transaction(table):
    updates, completions, claim = _a_step(table)
    said = _transactions(table)
    done = table.queue.write_step("d1", updates, completions, claim)
    assert (done.written, done.finished, len(done.claimed)) == (1, [True], 2)
    if table.kind == "sqlite":
        assert [s for s in said if s.split()[0] in ("BEGIN", "COMMIT", "ROLLBACK")] == [
            "BEGIN IMMEDIATE", "COMMIT"]
    else:  # every row it wrote carries one transaction's id
        assert len(_writers(table)) == 1
    assert _rows(table) == [(1, "running", "d1", 1, 2), (2, "done", None, 1, 1),
                            (3, "running", "d1", 1, 0), (4, "running", "d1", 1, 0)]
    assert _jobs(table) == [(1, "in_progress", 1, 1, 3, 1), (2, "in_progress", 2, 0, 0, 1)]


def test_a_step_that_fails_at_its_end_writes_nothing_and_is_written_once_when_tried_again(table, monkeypatch):
    """The jobs' counters move last: a failure there undoes the tokens, the completion and the claim
    (no lease taken, no epoch raised), and the same step sent again writes each once."""
    updates, completions, claim = _a_step(table)
    rows, jobs = _rows(table), _jobs(table)
    moved = sql_queue.move_jobs

    def fail(tx, deltas, now):
        moved(tx, deltas, now)
        raise RuntimeError("the table failed the step")

    monkeypatch.setattr(sql_queue, "move_jobs", fail)
    with pytest.raises(RuntimeError):
        table.queue.write_step("d1", updates, completions, claim)
    assert (_rows(table), _jobs(table)) == (rows, jobs)
    monkeypatch.setattr(sql_queue, "move_jobs", moved)
    done = table.queue.write_step("d1", updates, completions, claim)
    assert (done.written, done.finished, [r.lease_epoch for r in done.claimed]) == (1, [True], [1, 1])
    assert _jobs(table) == [(1, "in_progress", 1, 1, 3, 1), (2, "in_progress", 2, 0, 0, 1)]
    again = table.queue.write_step("d1", (), completions, claim)  # the completion a second time
    assert (again.finished, again.claimed) == ([False], [])


def test_a_refused_output_in_a_step_fails_its_request_alone_and_the_claim_is_made_once(table, monkeypatch):
    """The table refuses one completion's text (the codec bypassed: PostgreSQL refuses the NUL, SQLite's
    driver the surrogate): the step is sent again a row at a time; that request fails with why, the
    tokens are written and the claim leases each request once."""
    monkeypatch.setattr(textcodec, "encode_text", lambda text: text)
    updates, (completion,), claim = _a_step(table)
    refused = replace(completion, output_text="bad\x00\udc80")
    done = table.queue.write_step("d1", updates, [refused], claim)
    assert (done.written, done.finished, [r.lease_epoch for r in done.claimed]) == (1, [True], [1, 1])
    assert _rows(table) == [(1, "running", "d1", 1, 2), (2, "failed", None, 1, 1),
                            (3, "running", "d1", 1, 0), (4, "running", "d1", 1, 0)]
    with table.db.read() as conn:
        why = conn.execute(text("SELECT error FROM requests WHERE id = 2")).scalar()
    assert why.startswith(REFUSED_PREFIX)
    assert _jobs(table) == [(1, "in_progress", 1, 0, 3, 1), (2, "in_progress", 2, 0, 0, 1)]


class _CountedCursor:
    """A driver cursor whose executes are counted (every statement sent, BEGIN and COMMIT aside)."""

    def __init__(self, cursor, counted: list[str]):
        self._cursor, self._counted = cursor, counted

    def execute(self, sql, *args, **kwargs):
        self._counted.append(sql)
        return self._cursor.execute(sql, *args, **kwargs)

    def executemany(self, sql, *args, **kwargs):
        self._counted.append(sql)
        return self._cursor.executemany(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._cursor, name)


def test_a_tokens_only_step_moves_its_jobs_counters_in_a_fixed_number_of_statements(table, monkeypatch):
    """32 online requests (a job each) add tokens in one step: each job's counter moves by its own
    tokens, in two statements for the counters on PostgreSQL (its jobs locked in id order, then one
    update), not one statement a job."""
    table.catalog.submit([submission(1) for _ in range(32)])
    held = table.queue.claim("d1", per_group=64)
    assert len(held) == 32
    counted: list[str] = []
    made = direct.Tx.__init__
    monkeypatch.setattr(direct.Tx, "__init__",
                        lambda tx, cursor, dialect: made(tx, _CountedCursor(cursor, counted), dialect))
    updates = [TokenUpdate(r.id, tuple(range(1 + i % 3)), "x" * (1 + i % 3), lease_epoch=r.lease_epoch)
               for i, r in enumerate(held)]
    assert table.queue.write_step("d1", updates, ()).written == 32
    counters = [sql for sql in counted if sql.lstrip().upper().startswith(("UPDATE JOBS", "SELECT JOBS"))]
    assert len(counters) == (2 if table.kind == "postgresql" else 1)
    assert sorted(row[4] for row in _jobs(table)) == sorted(1 + i % 3 for i in range(32))
