"""Short transactions on a DBAPI connection a store keeps, running `Prepared` statements.

The daemon makes a few short transactions every step (claim, tokens,
completions). Through SQLAlchemy each also paid a pooled connection's
checkout and return (on PostgreSQL a ping with it), its begin and commit
events and, on PostgreSQL, a round trip each for BEGIN, COMMIT and the
write's own idle-in-transaction limit: more than the statements themselves.
Here:

- one connection per thread, taken from the pool once (its connect hooks
  ran: SQLite's pragmas, the drivers' JSON adapters) and kept;
- a read is one statement, run alone (no transaction around it);
- SQLite: a write begins IMMEDIATE, retried briefly while another
  connection writes, exactly as `Database.write` does;
- PostgreSQL: every transaction here is a few statements with no waiting
  in between, so the short idle-in-transaction limit of a write
  (storage/db.py) is set once for the session. A connection left idle
  `PING_IDLE_S` is pinged before use (as the pool's pre-ping does at every
  checkout): a server restarted meanwhile costs no failed call. (Sending a
  write's statements in one pipeline saved no CPU here, measured: the
  driver's cost is per statement, not per round trip);
- PostgreSQL: `many` sends all its rows as one statement (a `Batched` one:
  storage/prepared.py), or else one synced statement a row, never in the
  driver's pipeline. The server's idle limit only runs once it has answered
  all it was sent: a process stopped (SIGSTOP, a VM pause) between two rows
  of a pipeline left its session 'active', holding the rows it had written
  so far, and every other daemon's job counters, for as long as it stayed
  stopped. One statement at a time, it is idle in its transaction between
  any two, and the server ends it after the limit. One statement for all the
  rows also costs the least: 1,024 rows like a flush's took 5.7-6.4 µs of
  client CPU a row, against 11.4-11.6 pipelined and 20.5-21.6 one at a time
  (measured on psycopg alone);
- a driver's failure rolls the transaction back and becomes the same
  StorageError as `Database`'s (a value the table refuses stays the driver's
  DataError, or `Refused`: storage/refusals.py); a connection that failed,
  or that the server closed (whatever the error says: a transaction ended
  for idling past its limit is the driver's InternalError), is dropped, and
  the next transaction opens another.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from fsched.storage.db import PG_IDLE_IN_TRANSACTION_MS, Database, begin_immediate
from fsched.storage.prepared import ROWS, Batched, Prepared

PING_IDLE_S = 1.0
# One simple-protocol query, two statements: the second applies to this transaction alone.
LEASE_ONLY_BEGIN = "BEGIN; SET LOCAL synchronous_commit = off"
INVALID_STATEMENT_NAME = "26000"  # PostgreSQL's error code for an EXECUTE of a name its session lacks


class Ready(NamedTuple):
    """A statement's rows in its driver's form, made before a transaction takes its lock (the Python
    work of a write kept out of the time other writers wait for it): `Tx.many_ready` runs them."""

    compiled: Any  # the statement compiled for this connection's dialect
    rows: list


class Tx:
    """One transaction's statements (a cursor of the kept connection)."""

    __slots__ = ("_cursor", "_dialect", "_synced")

    def __init__(self, cursor, dialect) -> None:
        self._cursor = cursor
        self._dialect = dialect
        self._synced = dialect.name == "postgresql"  # `many`: a row at a time (the module's docstring)

    @property
    def locks_rows(self) -> bool:
        """Whether other writers run beside this transaction (PostgreSQL: row locks; SQLite has one
        writer at a time)."""
        return self._synced

    def rows(self, prepared: Prepared, params: Mapping[str, Any] | None = None) -> list:
        """The statement's rows, named tuples of its columns."""
        compiled, bound = prepared.bound(self._dialect, params)
        self._cursor.execute(compiled.sql, bound)
        return compiled.rows(self._cursor)

    def unread_rows(self, prepared: Prepared, params: Mapping[str, Any] | None = None
                    ) -> tuple[list, Callable[[Sequence], list]]:
        """`rows` with their values not processed yet, and the function that processes them (later:
        after the commit, where the write lock is not held meanwhile)."""
        compiled, bound = prepared.bound(self._dialect, params)
        self._cursor.execute(compiled.sql, bound)
        return compiled.unread_rows(self._cursor), compiled.read

    def first(self, prepared: Prepared, params: Mapping[str, Any] | None = None):
        rows = self.rows(prepared, params)
        return rows[0] if rows else None

    def run(self, prepared: Prepared, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement that returns no rows; the rows it changed."""
        compiled, bound = prepared.bound(self._dialect, params)
        self._cursor.execute(compiled.sql, bound)
        return self._cursor.rowcount

    def many(self, prepared: Prepared, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement (not a listed one) for each of `params`: a `Batched` one's rows in one statement
        on PostgreSQL, otherwise one executemany (PostgreSQL: a synced statement a row)."""
        if not params:
            return
        if self._synced and isinstance(prepared, Batched):
            compiled = prepared.together(self._dialect)
            self._cursor.execute(compiled.sql, compiled.driver_params({ROWS: params}), prepare=True)
            return
        compiled = prepared.compiled(self._dialect)
        if self._synced:
            execute, sql = self._cursor.execute, compiled.sql
            for p in params:
                execute(sql, compiled.driver_params(p), prepare=True)
            return
        self._cursor.executemany(compiled.sql, [compiled.driver_params(p) for p in params])

    def many_ready(self, ready: Ready) -> None:
        """`many` for rows made before the transaction (`DirectConnection.ready`, where writers take
        turns: one executemany)."""
        if ready.rows:
            self._cursor.executemany(ready.compiled.sql, ready.rows)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the transaction that an error undoes alone (the error goes on to the caller)."""
        self._cursor.execute("SAVEPOINT fsched_part")
        try:
            yield
        except BaseException:
            self._cursor.execute("ROLLBACK TO SAVEPOINT fsched_part")
            self._cursor.execute("RELEASE SAVEPOINT fsched_part")
            raise
        self._cursor.execute("RELEASE SAVEPOINT fsched_part")


def connection_lost(dialect, exc: BaseException, raw) -> bool:
    """Whether the driver's error left the connection closed (the server ended the session)."""
    return isinstance(exc, dialect.loaded_dbapi.Error) and dialect.is_disconnect(exc, raw, None)


class KeptConnection:
    """A driver connection kept out of the pool (its pool record, to close or invalidate it through),
    and when it was last used."""

    __slots__ = ("proxied", "raw", "session", "used_at")

    def __init__(self, proxied) -> None:
        self.proxied = proxied  # the pool's record of it: closed or invalidated through it
        self.raw = proxied.driver_connection
        self.used_at = time.monotonic()
        self.session = None  # PostgreSQL: its SessionStatements, once a `write_once` needs them


class DirectConnection:
    """A Database's connection kept for each thread that asks, and transactions on it."""

    def __init__(self, db: Database):
        self.db = db
        self._dialect = db.engine.dialect
        self._dbapi = db.engine.dialect.loaded_dbapi
        self._sqlite = db.dialect == "sqlite"
        self._busy_timeout_s = db.busy_timeout_ms / 1000
        self._local = threading.local()
        self._all: list[KeptConnection] = []
        self._lock = threading.Lock()
        self._once: dict[str, Any] = {}  # `write_once`'s statements (by SQL): what each session prepares
        self._by_name_ok = True  # False once a session lost them (a pooler): sent as text from then on
        db.on_dispose(self.close)

    @contextmanager
    def write(self, lease_only: bool = False) -> Iterator[Tx]:
        """A write transaction. `lease_only`: it writes nothing but leases (a claim), which a database
        crash may undo without losing anything of the record (the rows go back to the queue, and their
        holder's later writes, under the lost lease's epoch, are refused): on PostgreSQL its COMMIT
        does not wait for its WAL to reach the disk (`synchronous_commit` off for it alone, said with
        its BEGIN: no round trip more); that flush is a COMMIT's dearest part on a loaded machine."""
        with self._transaction(write=True, lease_only=lease_only) as tx:
            yield tx

    @property
    def one_writer(self) -> bool:
        """Whether writers take turns on one lock (SQLite): every other writer waits while a write
        transaction runs, so what it can make before it begins (`ready`) is made then."""
        return self._sqlite

    def ready(self, prepared: Prepared, params: Sequence[Mapping[str, Any]]) -> Ready:
        """`prepared`'s rows for `params`, in the driver's form, made now (see `Ready`)."""
        compiled = prepared.compiled(self._dialect)
        return Ready(compiled, [compiled.driver_params(p) for p in params])

    def connect(self) -> None:
        """The calling thread's connection opened now, not at its first transaction: a read that runs
        nothing."""
        with self.read():
            pass

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._transaction(write=False) as tx:
            yield tx

    @contextmanager
    def _transaction(self, write: bool, lease_only: bool = False) -> Iterator[Tx]:
        dbapi = self._dbapi
        failures = (dbapi.OperationalError, dbapi.InterfaceError)
        try:
            kept = self._connection()
            raw = kept.raw
            if self._sqlite and write:
                begin_immediate(raw, self._busy_timeout_s)
            cursor = raw.cursor()
        except failures as exc:
            self._drop()
            raise self.db.failure(exc) from exc
        try:
            if write and not self._sqlite:
                cursor.execute(LEASE_ONLY_BEGIN if lease_only else "BEGIN")
            yield Tx(cursor, self._dialect)
            if write:
                cursor.execute("COMMIT")
        except BaseException as exc:
            if write:
                self._rollback(raw)
            self._raise_if_lost(exc, raw, failures)
            raise
        finally:
            kept.used_at = time.monotonic()

    def write_once(self, prepared: Prepared, params: Mapping[str, Any] | None = None,
                   lease_only: bool = False) -> list:
        """One statement in a write transaction of its own (`lease_only` as `write` takes it); its rows.
        On PostgreSQL in one round trip: BEGIN, the statement and COMMIT in one query of the simple
        protocol, the statement run by its name, prepared once for the connection's session
        (storage/session.py), with its parameters as literals. (A claim through `write` took six round
        trips, each a wait on the server and then for this process's turn again on a busy machine.)"""
        if self._sqlite:
            with self.write(lease_only) as tx:
                return tx.rows(prepared, params)
        dbapi = self._dbapi
        failures = (dbapi.OperationalError, dbapi.InterfaceError)
        try:
            kept = self._connection()
        except failures as exc:
            self._drop()
            raise self.db.failure(exc) from exc
        compiled, bound = prepared.bound(self._dialect, params)
        self._once.setdefault(compiled.sql, compiled)
        try:
            text = self._by_name(kept, compiled, bound)
            cursor = kept.raw.cursor()  # no parameters: the simple protocol, several statements a query
            cursor.execute(f"{LEASE_ONLY_BEGIN if lease_only else 'BEGIN'}; {text}; COMMIT")
            for _ in range(2 if lease_only else 1):
                cursor.nextset()
            return compiled.rows(cursor)
        except BaseException as exc:
            self._rollback(kept.raw)
            self._raise_if_lost(exc, kept.raw, failures)
            if getattr(exc, "sqlstate", None) == INVALID_STATEMENT_NAME and self._by_name_ok:
                # Its session lost what it prepared without a rollback (a pooler in transaction mode:
                # storage/session.py): sent as text from now on, this one again at once.
                self._by_name_ok = False
                return self.write_once(prepared, params, lease_only)
            raise
        finally:
            kept.used_at = time.monotonic()

    def _by_name(self, kept: KeptConnection, compiled, bound) -> str:
        """The statement as one EXECUTE of its session-prepared name, its parameters as literals (as text
        where the session keeps no prepared statement)."""
        from fsched.storage.session import SessionStatements, literal_text  # psycopg: PostgreSQL only

        if not self._by_name_ok:
            return literal_text(kept.raw, compiled.sql, bound)
        if kept.session is None:
            kept.session = SessionStatements(kept.raw)
        text = kept.session.by_name(compiled, bound)
        if text is None:  # first use on this connection, or after a rollback: prepared (one round trip)
            kept.session.prepare_all(list(self._once.values()))
            text = kept.session.by_name(compiled, bound) or literal_text(kept.raw, compiled.sql, bound)
        return text

    def _raise_if_lost(self, exc: BaseException, raw, failures: tuple) -> None:
        """A driver's failure, or a connection the server closed: that connection dropped, and the failure
        raised as the table's StorageError (else nothing: the caller raises the error as it is)."""
        if isinstance(exc, failures) or connection_lost(self._dialect, exc, raw):
            self._drop()
            raise self.db.failure(exc) from exc

    def _rollback(self, raw) -> None:
        with contextlib.suppress(Exception):  # a connection that failed may not even roll back
            if not self._sqlite or raw.in_transaction:
                raw.execute("ROLLBACK")
        kept: KeptConnection | None = getattr(self._local, "kept", None)
        if kept is not None and kept.session is not None:
            kept.session.forget()  # the driver's answer to a rollback (storage/session.py)

    def _connection(self) -> KeptConnection:
        kept: KeptConnection | None = getattr(self._local, "kept", None)
        if kept is not None and not self._sqlite and time.monotonic() - kept.used_at > PING_IDLE_S:
            try:
                kept.raw.execute("SELECT 1")
            except (self._dbapi.OperationalError, self._dbapi.InterfaceError):
                self._drop()
                kept = None
        if kept is None:
            kept = self._local.kept = KeptConnection(self.db.engine.raw_connection())
            if not self._sqlite:
                # Its transactions are this module's: BEGIN and COMMIT said, not the driver's.
                kept.raw.autocommit = True
                # Every transaction here is short (db.py's write limit, for the whole session).
                limit = int(PG_IDLE_IN_TRANSACTION_MS)
                kept.raw.execute(f"SET idle_in_transaction_session_timeout = {limit}")
            with self._lock:
                self._all.append(kept)
        return kept

    def _drop(self) -> None:
        """Forget this thread's connection (it failed): the pool discards it."""
        kept: KeptConnection | None = getattr(self._local, "kept", None)
        self._local.kept = None
        if kept is None:
            return
        with self._lock:
            if kept in self._all:
                self._all.remove(kept)
        with contextlib.suppress(Exception):
            kept.proxied.invalidate()

    def close(self) -> None:
        """Hand every kept connection back to the pool (Database.dispose then closes them)."""
        with self._lock:
            kept, self._all = self._all, []
        for k in kept:
            with contextlib.suppress(Exception):
                if not self._sqlite:
                    k.raw.autocommit = False  # as the pool hands its connections out
                k.proxied.close()
        self._local = threading.local()
