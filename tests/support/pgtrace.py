"""PostgreSQL's protocol as a store's connections speak it: round trips counted in the driver's own trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg import pq
from sqlalchemy import event

if TYPE_CHECKING:
    from fsched.storage.sql_catalog import SqlCatalogStore


class Traced:
    """The protocol messages of every connection the store opens from now on (libpq's trace)."""

    def __init__(self, store: SqlCatalogStore, path) -> None:
        self.path = path
        self.file = open(path, "w")  # noqa: SIM115 - open while the connections trace into it
        self.conns: list = []
        store.db.engine.dispose()  # those opened so far are not traced
        event.listen(store.db.engine, "connect", lambda dbapi_conn, _rec: self._opened(dbapi_conn.pgconn))

    def _opened(self, pgconn) -> None:
        self.conns.append(pgconn)
        self._trace(pgconn)

    def _trace(self, pgconn) -> None:
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def round_trips(self, call) -> int:
        """The round trips `call` makes: each a Sync (a statement's end) or a Query sent."""
        for pgconn in self.conns:
            pgconn.untrace()  # written out
        start = self.path.stat().st_size
        for pgconn in self.conns:
            self._trace(pgconn)
        call()
        for pgconn in self.conns:
            pgconn.untrace()
        with open(self.path) as f:
            f.seek(start)
            sent = [line.split("\t") for line in f if line.startswith("F\t")]
        return sum(1 for fields in sent if fields[2].split()[0] in ("Sync", "Query"))
