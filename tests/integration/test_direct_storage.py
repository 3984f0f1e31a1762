"""The daemon's statements on the driver (storage/prepared.py, storage/direct.py), on SQLite and PostgreSQL:
the same rows as SQLAlchemy's own execution, any list length, the types' processing both ways, a
kept connection that fails or is cut (or that the server ended for idling in a write) gives the next
transaction a fresh one, and a process stopped inside a write, even between the rows of a `many`,
holds no lock past PostgreSQL's idle limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, bindparam, func, select, text

from fsched.core.ports.records import StorageError
from fsched.storage.claim import CANDIDATE_JOBS
from fsched.storage.db import Database
from fsched.storage.direct import DirectConnection
from fsched.storage.output import read as read_outputs
from fsched.storage.output import whole_output
from fsched.storage.prepared import Prepared, listed
from fsched.storage.rows import requests
from tests.support.tables import InSql, submission

COLUMNS = (requests.c.id, requests.c.custom_id, requests.c.params, requests.c.output_tokens)
READ = Prepared(lambda n: select(*COLUMNS).where(listed(requests.c.id, "b_ids", n)).order_by(requests.c.id),
                listed="b_ids")
WRITE = Prepared(requests.update().where(requests.c.id == bindparam("b_id")).values(
    output_text=bindparam("b_text", type_=requests.c.output_text.type),
    output_tokens=bindparam("b_tokens", type_=requests.c.output_tokens.type)))


@pytest.fixture(params=["sqlite", "postgresql"])
def table(request):
    made = InSql(request.getfixturevalue(f"{'pg' if request.param == 'postgresql' else 'sqlite'}_url"))
    yield made
    made.db.dispose()


def test_a_listed_statement_reads_what_sqlalchemy_reads_at_every_length(table):
    table.catalog.submit([submission(130)])
    with table.db.read() as conn:
        ids = [row.id for row in conn.execute(select(requests.c.id).order_by(requests.c.id))]
    direct = DirectConnection(table.db)
    for n in (*range(1, 10), 63, 64, 65, 130):  # past the driver's 50 parameters, and past a power of two
        with table.db.read() as conn:
            expected = [tuple(row) for row in conn.execute(
                select(*COLUMNS).where(requests.c.id.in_(ids[:n])).order_by(requests.c.id))]
        with direct.read() as tx:
            got = tx.rows(READ, {"b_ids": ids[:n]})
        assert [tuple(row) for row in got] == expected
        assert [row.custom_id for row in got] == [f"c{i}" for i in range(n)]  # by name, too


def test_values_go_through_the_columns_types_both_ways(table):
    table.catalog.submit([submission(2)])
    direct = DirectConnection(table.db)
    with direct.read() as tx:
        first, second = (row.id for row in tx.rows(READ, {"b_ids": [1, 2]}))
    odd = "nul\x00 and a lone \udc80 surrogate"  # what the text codec makes storable
    with direct.write() as tx:
        tx.many(WRITE, [{"b_id": first, "b_text": odd, "b_tokens": [1, 2, 3]},
                        {"b_id": second, "b_text": "plain", "b_tokens": []}])
    with table.db.read() as conn:
        stored = dict(conn.execute(select(requests.c.id, requests.c.output_text)).all())
    assert stored == {first: odd, second: "plain"}
    with direct.read() as tx:
        assert [row.output_tokens for row in tx.rows(READ, {"b_ids": [first, second]})] == [[1, 2, 3], []]


def test_a_list_expanded_at_each_execution_is_refused_when_compiled(table):
    with pytest.raises(ValueError, match="listed"):
        with DirectConnection(table.db).read() as tx:
            tx.rows(Prepared(select(requests.c.id).where(requests.c.id.in_([1, 2]))))


def test_a_failed_write_is_undone_and_holds_no_lock(table):
    table.catalog.submit([submission(1)])
    direct = DirectConnection(table.db)
    with pytest.raises(RuntimeError):
        with direct.write() as tx:
            tx.many(WRITE, [{"b_id": 1, "b_text": "lost", "b_tokens": [9]}])
            raise RuntimeError("the caller's own failure")
    with table.db.write() as conn:  # another connection writes at once
        conn.execute(text("UPDATE requests SET output_text = 'other' WHERE id = 1"))
    with direct.write() as tx:  # and the kept one goes on
        tx.many(WRITE, [{"b_id": 1, "b_text": "kept", "b_tokens": [1]}])
    with table.db.read() as conn:
        assert conn.execute(text("SELECT output_text FROM requests WHERE id = 1")).scalar() == "kept"


def test_a_connection_the_server_ended_is_replaced(pg_url, monkeypatch):
    from fsched.storage import direct as direct_module

    made = InSql(pg_url)
    try:
        direct = DirectConnection(made.db)
        with direct.read() as tx:
            tx.rows(CANDIDATE_JOBS)
        with made.db.write() as conn:  # every other session of this database ended (a restart)
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        monkeypatch.setattr(direct_module, "PING_IDLE_S", 0.0)  # it was idle: pinged before use
        with direct.read() as tx:
            assert tx.rows(CANDIDATE_JOBS) == []
        with made.db.write() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        monkeypatch.setattr(direct_module, "PING_IDLE_S", 3600.0)  # not pinged: the call fails, once
        with pytest.raises(StorageError):
            with direct.read() as tx:
                tx.rows(CANDIDATE_JOBS)
        with direct.read() as tx:
            assert tx.rows(CANDIDATE_JOBS) == []
    finally:
        made.db.dispose()


BACKEND_PID = Prepared(select(func.pg_backend_pid().label("pid")))


def _until_gone(db: Database, pid: int, timeout_s: float = 20.0) -> None:
    """Wait until the server has ended session `pid` (fails after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with db.read() as conn:
            if not conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                                {"p": pid}).scalar_one():
                return
        assert time.monotonic() < deadline, f"session {pid} still there"
        time.sleep(0.05)


def test_a_write_the_server_ended_for_idling_is_a_storage_error_and_the_next_one_works(pg_url, monkeypatch):
    """A daemon stopped inside a write (SIGSTOP, a VM pause) past the idle limit: the server ends its
    session, and the driver says so with an InternalError, not an OperationalError. It is a lost
    connection all the same (the daemon retries), and the next transaction opens a new one."""
    from fsched.storage import direct as direct_module

    monkeypatch.setattr(direct_module, "PG_IDLE_IN_TRANSACTION_MS", 200)
    made = InSql(pg_url)
    try:
        direct = DirectConnection(made.db)
        with pytest.raises(StorageError, match="idle-in-transaction"):
            with direct.write() as tx:
                pid = tx.first(BACKEND_PID).pid
                _until_gone(made.db, pid)  # idle in its transaction past the limit
                tx.rows(CANDIDATE_JOBS)
        with direct.write() as tx:
            assert tx.first(BACKEND_PID).pid != pid
            assert tx.rows(CANDIDATE_JOBS) == []
    finally:
        made.db.dispose()


PROBE = Table("stall_probe", MetaData(), Column("id", Integer, primary_key=True), Column("n", Integer))
# A process writing two rows in one `many` that stops itself (SIGSTOP) as the driver takes its second
# row's value, so after its first row went to the server: what a stop at any moment between them does.
STOPPED_MID_MANY = """
import os, signal, sys
import psycopg
from psycopg.types.numeric import Int8Dumper
from sqlalchemy import Column, Integer, MetaData, Table, bindparam
from fsched.core.ports.records import StorageError
from fsched.storage import direct as direct_module
from fsched.storage.db import Database
from fsched.storage.prepared import Prepared

PROBE = Table("stall_probe", MetaData(), Column("id", Integer, primary_key=True), Column("n", Integer))

class Stop(int):
    pass

class StoppingDumper(Int8Dumper):
    def dump(self, obj):
        os.kill(os.getpid(), signal.SIGSTOP)
        return super().dump(int(obj))

psycopg.adapters.register_dumper(Stop, StoppingDumper)
direct_module.PG_IDLE_IN_TRANSACTION_MS = 200
add = Prepared(PROBE.update().where(PROBE.c.id == bindparam("b_id")).values(n=PROBE.c.n + bindparam("b_n")))
db = Database(sys.argv[1])
try:
    with direct_module.DirectConnection(db).write() as tx:
        tx.many(add, [{"b_id": 1, "b_n": 1}, {"b_id": 2, "b_n": Stop(1)}])
except StorageError as exc:
    print("StorageError", exc)
else:
    print("committed")
"""


def test_a_process_stopped_between_the_rows_of_a_write_holds_no_lock_past_the_idle_limit(pg_url):
    """The server's idle limit ends a stopped daemon's transaction, so its locks (its requests', every
    job's counters) go with it: also when it stopped in the middle of a `many`. (In the driver's pipeline
    the server, waiting for the rest, never counted itself idle: the rows stayed locked, and every other
    daemon's write waited on them, as long as the process stayed stopped.)"""
    made = InSql(pg_url)
    PROBE.create(made.db.engine)
    with made.db.write() as conn:
        conn.execute(PROBE.insert(), [{"id": 1, "n": 0}, {"id": 2, "n": 0}])
    child = subprocess.Popen([sys.executable, "-c", STOPPED_MID_MANY, pg_url],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), child.communicate()[0].decode()
        with made.db.write() as conn:  # another writer of the row it wrote: not kept waiting
            conn.execute(text("SET LOCAL lock_timeout = '10s'"))
            conn.execute(PROBE.update().where(PROBE.c.id == 1).values(n=PROBE.c.n + 10))
        os.kill(child.pid, signal.SIGCONT)
        out = child.communicate(timeout=30)[0].decode()
        assert child.returncode == 0 and out.startswith("StorageError"), out
        with made.db.read() as conn:
            assert dict(conn.execute(select(PROBE.c.id, PROBE.c.n)).all()) == {1: 10, 2: 0}
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
        made.db.dispose()


def test_the_claim_finds_its_jobs_by_the_state_index(sqlite_url):
    """A table of many finished online jobs (each a job of one) is not read whole at every claim."""
    db = Database(sqlite_url)
    InSql(sqlite_url).db.dispose()  # the schema
    compiled = CANDIDATE_JOBS.compiled(db.engine.dialect)
    with db.read() as conn:
        plan = " ".join(row[-1] for row in conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + compiled.sql, tuple(compiled.driver_params({}))))
    db.dispose()
    assert "ix_jobs_state" in plan and "SCAN jobs" not in plan


def _variants_compiled() -> int:
    from fsched.storage.sql_queue import daemon_statements

    return sum(len(each._variants) for each in daemon_statements())


def test_a_prepared_store_compiles_nothing_while_it_claims_and_writes(table):
    """What a daemon's steps run is compiled when it starts (`prepare`), not a list length at a time in
    its first steps."""
    from fsched.core.ports.records import Completion, TokenUpdate
    from fsched.core.types import Logprob, RequestStatus, TokenLogprobs

    table.catalog.submit([submission(9)])
    table.queue.prepare(16)
    before = _variants_compiled()
    claimed = table.queue.claim("d1", per_group=16)
    assert len(claimed) == 9
    logprobs = (TokenLogprobs(Logprob(5, -0.5, "x")),) * 2
    for n in (1, 3, 9):
        assert table.queue.flush_tokens("d1", [TokenUpdate(r.id, (5, 6), "xy", logprobs=logprobs)
                                               for r in claimed[:n]]) == n
    done = [Completion(r.id, RequestStatus.FINISHED_STOPPED, (5, 6, 7), "xyz", logprobs=logprobs * 2)
            for r in claimed]
    assert table.queue.finish_requests(done, "d1") == [True] * 9
    assert _variants_compiled() == before


def _stored(table, ids) -> dict:
    """The rows as stored, each with its output as the table's readers read it (a running request's row
    and its pieces)."""
    with table.db.read() as conn:
        columns = ("id", "state", "output_tokens", "output_text", "num_output_tokens", "first_token_at",
                   "error", "model", "prompt_tokens", "finish_reason", "lease_owner", "finished_at")
        rows = conn.execute(select(*(requests.c[name] for name in columns))
                            .where(requests.c.id.in_([int(i) for i in ids]))).all()
        outputs = read_outputs(conn, rows)
    return {str(row.id): SimpleNamespace(**{**row._mapping, **_output(row, outputs)}) for row in rows}


def _output(row, outputs) -> dict:
    tokens, text = whole_output(row, outputs.get(row.id))
    return {"output_tokens": list(tokens), "output_text": text}


ODD_TEXT = "a\x00b\udc80c\ufdd0d ✓"  # NUL, a lone surrogate, the codec's escape: stored through it
BIG_TEXT = "é✓🙂x" * 250_000  # a megabyte of it


def test_a_write_of_many_rows_stores_each_rows_values_as_they_were(table):
    """Tokens, texts (unicode, NUL and surrogates, a megabyte), NULLs and first-token times (the first one
    kept) come back as written, whether the rows went one a row or in one statement."""
    from fsched.core.ports.records import Completion, TokenUpdate
    from fsched.core.types import RequestStatus

    table.catalog.submit([submission(4)])
    a, b, c, d = (r.id for r in table.queue.claim("d1", per_group=4))
    assert table.queue.flush_tokens("d1", []) == 0 and table.queue.finish_requests([], "d1") == []
    assert table.queue.flush_tokens("d1", [
        TokenUpdate(a, (1, 2), "héllo ✓ 🙂", first_token_at=100.25), TokenUpdate(b, (3,), ODD_TEXT),
        TokenUpdate(c, tuple(range(5000)), BIG_TEXT, first_token_at=1.5e9 + 0.123456),
        TokenUpdate(d, (), "", first_token_at=None)]) == 4
    assert table.queue.flush_tokens("d1", [TokenUpdate(a, (1, 2, 4), "héllo ✓ 🙂!", first_token_at=200.0),
                                           TokenUpdate(b, (3, 5), ODD_TEXT * 2, first_token_at=7.0)]) == 2
    stored = _stored(table, [a, b, c, d])
    assert [(stored[k].output_tokens, stored[k].output_text, stored[k].num_output_tokens,
             stored[k].first_token_at) for k in (a, b, c, d)] == [
        ([1, 2, 4], "héllo ✓ 🙂!", 3, 100.25), ([3, 5], ODD_TEXT * 2, 2, 7.0),
        (list(range(5000)), BIG_TEXT, 5000, 1.5e9 + 0.123456), ([], "", 0, None)]
    assert table.queue.finish_requests([
        Completion(a, RequestStatus.FINISHED_STOPPED, (1, 2, 4, 6), "done ✓"),
        Completion(b, RequestStatus.FINISHED_FAILED, (3, 5), ODD_TEXT, error=ODD_TEXT, first_token_at=9.0),
        Completion(c, RequestStatus.FINISHED_LENGTH, (8,), BIG_TEXT, prompt_tokens=12, model="m-✓"),
        Completion(d, RequestStatus.FINISHED_STOPPED, (), "", first_token_at=3.0)], "d1") == [True] * 4
    stored = _stored(table, [a, b, c, d])
    assert [(s.state, s.output_tokens, s.output_text, s.error, s.model, s.prompt_tokens, s.finish_reason,
             s.first_token_at, s.lease_owner) for s in (stored[k] for k in (a, b, c, d))] == [
        ("done", [1, 2, 4, 6], "done ✓", None, None, None, "stop", 100.25, None),
        ("failed", [3, 5], ODD_TEXT, ODD_TEXT, None, None, None, 7.0, None),
        ("done", [8], BIG_TEXT, None, "m-✓", 12, "length", 1.5e9 + 0.123456, None),
        ("done", [], "", None, None, None, "stop", 3.0, None)]
    assert all(stored[k].finished_at is not None for k in (a, b, c, d))


def test_a_write_of_many_rows_is_one_statement_on_postgresql(pg_url, monkeypatch):
    """A flush's rows, their logprobs, a completion's rows and the job counters it moves go to the server as
    one statement each (none of them pipelined or sent one at a time): a process stopped while sending a
    write never leaves part of it sent."""
    import psycopg

    from fsched.core.ports.records import Completion, TokenUpdate
    from fsched.core.types import Logprob, RequestStatus, TokenLogprobs

    def logprobs(n: int) -> tuple[TokenLogprobs, ...]:
        return tuple(TokenLogprobs(Logprob(5 + i, -0.5, "x ✓")) for i in range(n))

    sent: list[str] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counted_execute(self, query, params=None, **kw):
        sent.append(str(query))
        return execute(self, query, params, **kw)

    def counted_executemany(self, query, params_seq, **kw):
        params_seq = list(params_seq)
        sent.extend([str(query)] * len(params_seq))
        return executemany(self, query, params_seq, **kw)

    made = InSql(pg_url)
    try:
        made.catalog.submit([submission(8), submission(8)])
        claimed = made.queue.claim("d1", per_group=16)
        monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
        monkeypatch.setattr(psycopg.Cursor, "executemany", counted_executemany)
        flushed = [TokenUpdate(r.id, (5, 6), "xy", logprobs=logprobs(2)) for r in claimed]
        assert made.queue.flush_tokens("d1", flushed) == 16

        def statements(start: str) -> int:
            return sum(sql.startswith(start) for sql in sent)

        assert (statements("UPDATE requests"), statements("INSERT INTO request_logprobs")) == (1, 1)
        sent.clear()
        done = [Completion(r.id, RequestStatus.FINISHED_STOPPED, (5, 6, 7), "xyz", logprobs=logprobs(3))
                for r in claimed]
        assert made.queue.finish_requests(done, "d1") == [True] * 16
        assert [statements(start) for start in ("UPDATE requests", "INSERT INTO request_logprobs")] == [1, 1]
        assert sum("UPDATE jobs SET" in sql for sql in sent) == 1  # their jobs locked and moved in one
    finally:
        made.db.dispose()


def test_a_claim_alone_commits_without_waiting_for_the_disk_and_a_write_of_tokens_waits(pg_url, monkeypatch):
    """A transaction of leases only (a claim) may be lost with a database crash without losing anything of
    the record (its rows go back to the queue): on PostgreSQL it does not wait for its WAL's flush, said
    with its BEGIN (no round trip more), for it alone; tokens and completions still wait."""
    import psycopg

    from fsched.core.ports.records import TokenUpdate
    from fsched.storage.direct import LEASE_ONLY_BEGIN

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted_execute(self, query, params=None, **kw):
        sent.append(str(query))
        return execute(self, query, params, **kw)

    made = InSql(pg_url)
    try:
        made.catalog.submit([submission(2)])
        monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
        claimed = made.queue.claim("d1", per_group=4, announced=True)
        assert len(claimed) == 2
        begins = [sql for sql in sent if sql.startswith("BEGIN")]
        assert begins == [LEASE_ONLY_BEGIN]
        sent.clear()
        assert made.queue.flush_tokens("d1", [TokenUpdate(r.id, (5,), "x") for r in claimed]) == 2
        assert [sql for sql in sent if sql.startswith("BEGIN")] == ["BEGIN"]
        kept = made.queue.direct._connection().raw  # the claim's: the setting was its transaction's alone
        assert kept.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    finally:
        made.db.dispose()
