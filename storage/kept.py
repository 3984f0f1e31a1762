"""A write connection a store keeps for one hot transaction (the HTTP server's group commit of online
requests on PostgreSQL), instead of the pool's per call.

Every online request waits for its group's transaction, and on PostgreSQL each
round trip in it is a wait on another process (its reply, then this thread's turn
for the interpreter again, behind a busy event loop). Through the pool a group
commit paid, besides its statements, BEGIN and COMMIT: a ping at checkout and the
write's own `SET LOCAL` idle-in-transaction limit (storage/db.py). Here:

- one SQLAlchemy connection, taken once and kept: no checkout, no return;
- its session has the short idle limit of a write, set once (every transaction
  on it is a write of a few statements with no waiting in between);
- a connection left idle `PING_IDLE_S` is pinged before use (the pool's
  pre-ping does so at every checkout): a server restarted meanwhile costs no
  failed call;
- one that failed (lost, or ended by the server) is dropped, and the next
  transaction opens another;
- one transaction at a time: a caller that finds it busy gets a pooled
  connection (`Database.write`), so callers in parallel still run in parallel.

The same rules as the daemon's kept connections (storage/direct.py, whose
idle ping interval it shares), over a SQLAlchemy Connection rather than the
driver's: the group commit's statements are SQLAlchemy Core's, run as they
are elsewhere in the catalog store.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from fsched.storage import db as db_module
from fsched.storage.db import Database
from fsched.storage.direct import PING_IDLE_S


class KeptWriter:
    """Write transactions on one kept connection (PostgreSQL), or the pool's where that is busy."""

    def __init__(self, db: Database, ping_idle_s: float | None = None):
        self.db = db
        self.ping_idle_s = PING_IDLE_S if ping_idle_s is None else ping_idle_s
        self._conn: Connection | None = None
        self._used_at = 0.0
        self._lock = threading.Lock()
        db.on_dispose(self.close)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        if not self._lock.acquire(blocking=False):  # another thread's transaction is on it
            with self.db.write() as conn:
                yield conn
            return
        try:
            with self.db.errors_translated():
                conn = self._connection()
                try:
                    with conn.begin():
                        yield conn
                except BaseException as exc:
                    if conn.invalidated or isinstance(exc, DBAPIError):  # the driver failed: a new one next
                        self._drop()
                    raise
                finally:
                    self._used_at = time.monotonic()
        finally:
            self._lock.release()

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and time.monotonic() - self._used_at > self.ping_idle_s:
            dialect = self.db.engine.dialect
            try:
                dialect.do_ping(conn.connection.dbapi_connection)
            except dialect.loaded_dbapi.Error:
                self._drop()
                conn = None
        if conn is None:
            conn = self.db.engine.connect()
            try:
                conn.exec_driver_sql(
                    f"SET idle_in_transaction_session_timeout = {int(db_module.PG_IDLE_IN_TRANSACTION_MS)}")
                conn.commit()
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
                conn.close()

    def close(self) -> None:
        """Hand the kept connection back to the pool (Database.dispose then closes it)."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
