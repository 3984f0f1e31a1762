"""PostgreSQL's planner statistics of the daemon's tables, kept fresh while a daemon runs.

PostgreSQL plans a statement from its statistics of each table (how many
rows, how they spread), which only ANALYZE updates: autovacuum runs it once
a table has changed by a tenth since the last one, but looks at most once a
minute. A table that grows faster than that (every online request is a job
row and a request row: a fresh table grows by thousands a minute) is planned
as the small table it was. Measured on a fresh table with 1,024 online
streams (bench/online_capacity.py on PostgreSQL): the daemon's statements
that name a list of ids (its jobs' counters locked, its completions and
counters written from a list of rows) ran as sequential scans of the whole
table, each row compared with the list (and the list's ids cast again for
every row): 2.6 ms for one step's 131 jobs in a table of 961, growing with
the table. The server spent 320 µs of CPU a request; with the tables analyzed
every 2 s, 175.

So a running daemon checks every CHECK_EVERY_S how much each of its tables
changed since its last ANALYZE (the server's own count) against how many
rows the planner believes it has, and analyzes, on a thread and connection
of its own (the loop never waits for it), a table that changed by more than
`SHARE` of that (and at least MIN_CHANGES rows): the rule autovacuum
follows, checked every few seconds instead of every minute. ANALYZE reads a
bounded sample of a table's rows whatever its size, and its count restarts
after any ANALYZE (autovacuum's, another daemon's): of several daemons on one
table, the first to see it stale analyzes it. SQLite plans without such
statistics: nothing to do there.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable

from fsched.storage.db import Database

log = logging.getLogger("fsched.daemon")

TABLES = ("jobs", "requests")
CHECK_EVERY_S = 2.0
MIN_CHANGES = 500
SHARE = 0.1
# An ANALYZE waits at most this long for its table's lock (another ANALYZE, a VACUUM holding it): the
# next check tries again.
LOCK_WAIT_MS = 1_000

_CHANGES = """
    SELECT s.relname, s.n_mod_since_analyze, c.reltuples
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = current_schema() AND s.relname = ANY(%s)
"""


def stale(changes: int, rows: float) -> bool:
    """Whether a table that changed by `changes` rows since its last ANALYZE, planned as `rows` rows (less
    than 0: never analyzed), is due another."""
    return changes >= max(MIN_CHANGES, SHARE * max(rows, 0.0))


def stale_tables(found: Iterable[tuple[str, int | None, float]]) -> dict[str, int]:
    """The tables due an ANALYZE, each with its changes, of (name, changes since its last one, rows the
    planner believes)."""
    return {name: changes for name, changes, rows in found if stale(changes or 0, rows)}


class StatisticsKeeper:
    """A thread that analyzes the daemon's tables on PostgreSQL when they changed enough (the module's
    docstring); `start` it once, `close` it at the end (it is a daemon thread: an exit stops it too)."""

    def __init__(self, db: Database, every_s: float = CHECK_EVERY_S):
        self.db = db
        self.every_s = every_s
        self.analyzed = 0  # ANALYZEs run (tests and logs)
        self._refused: set[str] = set()  # tables an ANALYZE of ours left as they were
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn = None  # the driver's connection, once the first check opened it

    def start(self) -> None:
        if self._thread is None and self.db.dialect == "postgresql":
            self._thread = threading.Thread(target=self._run, name="fsched-statistics", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=LOCK_WAIT_MS / 1000 + 2)
            self._thread = None
        self._drop()

    def check(self) -> list[str]:
        """Analyze the tables due it now; the ones analyzed. A table whose count of changes an ANALYZE of
        ours did not restart (PostgreSQL skips, with a warning, a table the role does not own) is not
        tried again (one warning): it waits for autovacuum, as without this keeper. Its own connection,
        outside the pool (its lock timeout is its session's alone), kept; one that failed is dropped, and
        the next check opens another."""
        try:
            if self._conn is None:
                self._conn = self.db.driver_connection()
                self._conn.autocommit = True
                self._conn.execute(f"SET lock_timeout = {LOCK_WAIT_MS}")
            return self._analyzed(self._conn)
        except BaseException:  # a connection that failed setting up is dropped too, not kept half set
            self._drop()
            raise

    def _analyzed(self, conn) -> list[str]:
        due = stale_tables(conn.execute(_CHANGES, (list(TABLES),)).fetchall())
        analyzed = []
        for table, changes in due.items():
            if table in self._refused:
                continue
            conn.execute(f"ANALYZE {table}")  # one of TABLES
            self.analyzed += 1
            analyzed.append(table)
            left = conn.execute(_CHANGES, ([table],)).fetchall()
            if left and (left[0][1] or 0) >= changes:  # the count did not restart: it was skipped
                self._refused.add(table)
                log.warning("cannot analyze the %s table (is the database role its owner?): its planner "
                            "statistics are left to autovacuum", table)
        return analyzed

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing more to do with it
                conn.close()

    def _run(self) -> None:
        failing = False
        while not self._closed.wait(self.every_s):
            try:
                self.check()
                failing = False
            except Exception:  # noqa: BLE001 - a speed-up only: the daemon goes on without it
                if not failing:
                    log.warning("could not refresh the planner's statistics of the job table (tried again "
                                "every %g s)", self.every_s, exc_info=True)
                failing = True
