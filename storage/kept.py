"""A write connection a store keeps for one hot transaction (the HTTP server's group commit of online
requests on PostgreSQL), instead of the pool's per call, and that transaction's statements sent in
batches, each batch one round trip.

Every online request waits for its group's transaction, and on PostgreSQL each
round trip in it is a wait on another process (its reply, then this thread's turn
for the interpreter again, behind a busy event loop). Through the pool a group
commit paid, besides its statements, BEGIN and COMMIT: a ping at checkout and the
write's own `SET LOCAL` idle-in-transaction limit (storage/db.py). Here:

- one connection, taken from the pool once and kept: no checkout, no return;
- its session has the short idle limit of a write, set once (every transaction
  on it is a write of a few statements with no waiting in between);
- a connection left idle `PING_IDLE_S` is pinged before use (the pool's
  pre-ping does so at every checkout): a server restarted meanwhile costs no
  failed call;
- one that failed (lost, or ended by the server) is dropped, and the next
  transaction opens another;
- one transaction at a time: a caller that finds it busy gets a pooled
  connection for its transaction (its idle limit said with its BEGIN), so
  callers in parallel still run in parallel;
- the transaction's statements go in batches (`Batches.send`): a batch is one
  query of the simple protocol, its statements' parameters bound into the
  text by the driver, BEGIN sent with the first batch and COMMIT with the
  last. The server runs a batch's statements one after the other, each
  seeing what was committed before it began (a count after a lock sees the
  work of the transaction it waited for). A query is one message, which the
  server only runs once it has all of it: a process stopped while sending
  one leaves its session idle in its transaction, where the idle limit ends
  it (a pipeline of the extended protocol's messages could leave it running
  the first statements, their locks held, waiting for the rest with no
  limit: storage/direct.py).

The same rules as the daemon's kept connections (storage/direct.py, whose
idle ping interval it shares).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import ClientCursor
from psycopg.pq import TransactionStatus

from fsched.storage import db as db_module
from fsched.storage.db import Database
from fsched.storage.direct import PING_IDLE_S, KeptConnection, connection_lost
from fsched.storage.prepared import Prepared
from fsched.storage.session import SessionStatements

Statement = tuple[Prepared, Mapping[str, Any]]
log = logging.getLogger("fsched.serve")


class Batches:
    """One transaction's statements, sent a batch at a time."""

    __slots__ = ("_begin", "_cursor", "_dialect", "_session", "trips")

    def __init__(self, cursor: ClientCursor, dialect, begin: Sequence[str],
                 session: SessionStatements | None = None) -> None:
        self._cursor = cursor
        self._dialect = dialect
        self._begin = begin  # the commands that begin the transaction, sent with the first batch
        self._session = session  # the connection's prepared statements (None: every statement as text)
        self.trips = 0

    def send(self, statements: Sequence[Statement], commit: bool = False) -> list[list]:
        """Run the statements in one round trip (and COMMIT after them with `commit`); each one's rows,
        named tuples of its columns."""
        cursor = self._cursor
        commands = list(self._begin) if self.trips == 0 else []
        skip = len(commands)
        compiled = []
        for prepared, params in statements:
            one, bound = prepared.bound(self._dialect, params)
            by_name = self._session.by_name(one, bound) if self._session is not None else None
            commands.append(by_name or cursor.mogrify(one.sql, bound))
            compiled.append(one)
        if commit:
            commands.append("COMMIT")
        self.trips += 1
        cursor.execute("; ".join(commands))
        for _ in range(skip):
            cursor.nextset()
        out = []
        for one in compiled:
            out.append(one.rows(cursor) if cursor.description else [])
            cursor.nextset()
        return out


class KeptWriter:
    """Write transactions on one kept connection (PostgreSQL), or the pool's where that is busy."""

    def __init__(self, db: Database, ping_idle_s: float | None = None, statements: Sequence[Prepared] = ()):
        self.db = db
        self.ping_idle_s = PING_IDLE_S if ping_idle_s is None else ping_idle_s
        self._kept: KeptConnection | None = None
        # what its kept connection prepares for its session (storage/session.py)
        self.statements = [prepared.compiled(db.engine.dialect) for prepared in statements]
        self._session: SessionStatements | None = None
        self._lock = threading.Lock()
        self._failures = (db.engine.dialect.loaded_dbapi.OperationalError,
                          db.engine.dialect.loaded_dbapi.InterfaceError)
        db.on_dispose(self.close)

    @contextmanager
    def write(self) -> Iterator[Batches]:
        """A write transaction: its statements sent in batches, the last with `commit`."""
        if not self._lock.acquire(blocking=False):  # another thread's transaction is on it
            with self._pooled() as batches:
                yield batches
            return
        try:
            kept = self._connection()
            try:
                if self._session.stale:
                    self._session.prepare_all(self.statements)
                with self._transaction(kept.raw, ("BEGIN",), self._session) as batches:
                    yield batches
            except BaseException as exc:
                if isinstance(exc, self._failures) or connection_lost(self.db.engine.dialect, exc, kept.raw):
                    self._drop()
                    raise self.db.failure(exc) from exc
                raise
            finally:
                kept.used_at = time.monotonic()
        finally:
            self._lock.release()

    def prepare(self) -> None:
        """Its connection opened and its statements prepared now, not at its first transaction: a write
        that sends nothing (BEGIN goes with a transaction's first batch)."""
        with self.write():
            pass

    @contextmanager
    def _pooled(self) -> Iterator[Batches]:
        try:
            proxied = self.db.engine.raw_connection()
        except self._failures as exc:
            raise self.db.failure(exc) from exc
        raw = proxied.driver_connection
        raw.autocommit = True
        limit = f"SET LOCAL idle_in_transaction_session_timeout = {int(db_module.PG_IDLE_IN_TRANSACTION_MS)}"
        try:
            with self._transaction(raw, ("BEGIN", limit)) as batches:
                yield batches
        except BaseException as exc:
            if isinstance(exc, self._failures) or connection_lost(self.db.engine.dialect, exc, raw):
                with contextlib.suppress(Exception):
                    proxied.invalidate()
                raise self.db.failure(exc) from exc
            raise
        finally:
            with contextlib.suppress(Exception):
                raw.autocommit = False  # as the pool hands its connections out
                proxied.close()

    @contextmanager
    def _transaction(self, raw, begin: Sequence[str], session: SessionStatements | None = None
                     ) -> Iterator[Batches]:
        batches = Batches(ClientCursor(raw), self.db.engine.dialect, begin, session)
        try:
            yield batches
            if raw.info.transaction_status != TransactionStatus.IDLE:  # its last batch did not commit
                raw.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(Exception):  # a connection that failed may not even roll back
                if raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                    raw.execute("ROLLBACK")
            if session is not None:
                session.forget()  # (the driver's cache of prepared statements: storage/session.py)
                if isinstance(exc, psycopg.errors.InvalidSqlStatementName):  # (a pooler: storage/session.py)
                    log.warning("prepared statements do not last on this connection's session (a pooler in "
                                "transaction mode?): the group commit sends its statements as text")
                    self.statements = []  # for good: a reconnect or a rollback prepares nothing again
            raise

    def _connection(self) -> KeptConnection:
        kept = self._kept
        if kept is not None and time.monotonic() - kept.used_at > self.ping_idle_s:
            try:
                kept.raw.execute("SELECT 1")
            except self._failures:
                self._drop()
                kept = None
        if kept is None:
            try:
                kept = KeptConnection(self.db.engine.raw_connection())
                # Its transactions are this module's: BEGIN and COMMIT said, not the driver's.
                kept.raw.autocommit = True
                kept.raw.execute(
                    f"SET idle_in_transaction_session_timeout = {int(db_module.PG_IDLE_IN_TRANSACTION_MS)}")
                self._session = SessionStatements(kept.raw)
            except self._failures as exc:
                if kept is not None:
                    with contextlib.suppress(Exception):
                        kept.proxied.invalidate()
                raise self.db.failure(exc) from exc
            self._kept = kept
        return kept

    def _drop(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            with contextlib.suppress(Exception):
                kept.proxied.invalidate()

    def close(self) -> None:
        """Hand the kept connection back to the pool (Database.dispose then closes it)."""
        with self._lock:
            kept, self._kept = self._kept, None
            if kept is not None:
                with contextlib.suppress(Exception):
                    kept.raw.autocommit = False  # as the pool hands its connections out
                    kept.proxied.close()
