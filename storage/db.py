"""Connecting to the job table: URL choice, SQLite setup, read and write transactions.

SQLite (one machine) runs in WAL mode with a busy timeout, and every write
transaction starts with `BEGIN IMMEDIATE`: a writer takes the lock up front
and waits its turn, instead of upgrading a read lock mid-transaction and
failing with "database is locked". Reads use a plain deferred
`BEGIN` and never block writers.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, Connection, Engine, Float, cast, create_engine, event, func
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from fsched.core.ports.records import StorageError
from fsched.storage.changes import ChangeListener

if TYPE_CHECKING:
    from fsched.storage.prepared import Prepared

DEFAULT_BUSY_TIMEOUT_MS = 30_000
# A write transaction left idle this long is ended by the server: shorter than any sensible lease TTL
# (the daemon's floor is 2 s), so a stalled client's row locks are gone before its leases expire.
PG_IDLE_IN_TRANSACTION_MS = 2_000
# Every other transaction's limit: a read takes no row locks, and a client descheduled for a
# couple of seconds between two of its statements (a loaded machine) must not lose its connection;
# a stalled reader is still ended before it holds a schema migration for long.
PG_READ_IDLE_IN_TRANSACTION_MS = 60_000
WAL_KEPT_BYTES = 64 * 1024 * 1024
# Free pages one incremental vacuum gives back in one transaction (16 MiB of 4 KiB pages): a large
# delete's space goes back in short write locks, not one long one.
VACUUM_PAGES = 4096
MEMORY_SCHEME = "memory:"


def default_database_path() -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "fsched" / "fsched.db"


def resolve_database_url(explicit: str | None = None) -> str:
    """`--db` wins, then FSCHED_DB, then the per-user SQLite file; a `memory:` URL stays as it is (an
    in-memory table of this process: storage/stores.py)."""
    url = explicit or os.environ.get("FSCHED_DB")
    if url:
        if "://" not in url and not url.startswith(MEMORY_SCHEME):  # a bare path is taken as an SQLite file
            url = f"sqlite:///{Path(url).expanduser().absolute()}"
        return url
    return f"sqlite:///{default_database_path()}"


def _prepare_sqlite_file(path: Path) -> None:
    """Create the folder 0700 and the file 0600 before SQLite opens it.

    SQLite gives its -wal and -shm files the database file's mode, so they
    are private too, whatever the umask.
    """
    folder = path.parent
    try:
        if not folder.exists():
            folder.mkdir(parents=True, mode=0o700)
            os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask
        if not path.exists():
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
            os.chmod(path, 0o600)
        elif not stat.S_ISREG(path.stat().st_mode):
            raise StorageError(f"database path {path} is not a regular file")
    except OSError as exc:
        raise StorageError(f"cannot create the database {path}: {exc.strerror}{storage_hint(path)}") from None


# SQLite's messages for failures of the file system under it (not of the SQL).
_IO_WORDS = ("unable to open", "disk I/O error", "disk is full", "readonly", "read-only")


def storage_hint(path: Path) -> str:
    """Why writing beside `path` may fail, when the file system can tell: read-only, full.

    SQLite's own words for these ("unable to open database file", "disk I/O
    error") do not name the cause: opening a WAL database writes its -shm
    file, so a full or read-only disk fails even a read.
    """
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        fs = os.statvfs(folder)
    except OSError:
        return ""
    if fs.f_flag & os.ST_RDONLY:
        return f" (the file system holding {folder} is read-only)"
    if fs.f_bavail * fs.f_frsize < 1 << 20:
        return f" (the file system holding {folder} is full: {fs.f_bavail * fs.f_frsize:,} bytes free)"
    if not os.access(folder, os.W_OK):
        return f" (no write permission on {folder})"
    return ""


POOL_SIZE = 16
POOL_OVERFLOW = 24


def _wire_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # Hand transaction control to the "begin" hook below (the SQLAlchemy
        # recipe for pysqlite), so BEGIN IMMEDIATE is ours to emit.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        # Deleted files give their pages back (`reclaim_space`): set on a new file only (before its first
        # table; an older one switches by the VACUUM its upgrade runs). Setting it on a file that has pages
        # writes its header, which a full disk refuses even to a reader.
        if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
            cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
        # A checkpointed WAL is cut back to this size instead of keeping its largest size for good.
        cursor.execute(f"PRAGMA journal_size_limit = {WAL_KEPT_BYTES}")
        if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            cursor.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL: a killed process loses no committed transaction.
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get("fsched_write", False):
            # the last attempt through SQLAlchemy: its error is SQLAlchemy's, as any statement's
            begin_immediate(conn.connection.driver_connection, busy_timeout_ms / 1000,
                            lambda: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        else:
            conn.exec_driver_sql("BEGIN")


# While another process writes, BEGIN IMMEDIATE is retried after these pauses (doubling, then the
# last again). SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25 ms...: a daemon and a server
# taking turns on the write lock then wait a sleep far longer than the other's transaction.
BUSY_RETRY_S = (0.0001, 0.001)


def begin_immediate(raw: sqlite3.Connection, timeout_s: float,
                    last_attempt: Callable[[], object] | None = None) -> None:
    """Take the write lock on a DBAPI connection, retrying briefly while another connection holds it,
    up to `timeout_s`; then `last_attempt` (by default the driver's BEGIN IMMEDIATE) raises its error."""
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + timeout_s
        pause, longest = BUSY_RETRY_S
        while time.monotonic() + pause < deadline:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                    break
            time.sleep(pause)
            pause = min(2 * pause, longest)
        (last_attempt or (lambda: raw.execute("BEGIN IMMEDIATE")))()
    finally:
        raw.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")


def _wire_postgresql(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # A process stopped inside a transaction (SIGSTOP, a VM pause, swap)
        # would hold its row locks forever, and FOR UPDATE SKIP LOCKED would
        # skip those rows forever: nobody could reclaim its expired leases.
        # The server ends such a transaction instead: every write transaction
        # sets the short limit for itself (Database.write), a few statements
        # with no waiting in between; this is the longer limit of the others.
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET idle_in_transaction_session_timeout = {int(PG_READ_IDLE_IN_TRANSACTION_MS)}")
        cursor.close()
        dbapi_connection.commit()


class database_clock(FunctionElement):  # noqa: N801 - used as SQL functions are, like func.now()
    """SQL for the database's clock in Unix seconds: leases and heartbeats use it, so daemons on
    machines whose clocks disagree still agree on who holds what. Each dialect writes it its own
    way, so a statement that reads it is the same statement on both (compiled once for each)."""

    type = Float()
    inherit_cache = True


@compiles(database_clock)
def _sqlite_clock(element, compiler, **kw) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(database_clock, "postgresql")
def _postgresql_clock(element, compiler, **kw) -> str:
    return compiler.process(cast(func.extract("epoch", func.clock_timestamp()), Float), **kw)


LISTENER_CONNECT_TIMEOUT_S = 3


class Database:
    """One job table behind one SQLAlchemy URL."""

    def __init__(self, url: str | None = None, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS):
        self.url = resolve_database_url(url)
        try:
            parsed = make_url(self.url)
        except ArgumentError:
            raise StorageError(f"not a database URL: {self.url!r}") from None
        self.dialect = parsed.get_backend_name()
        self.busy_timeout_ms = busy_timeout_ms
        self._on_dispose: list[Callable[[], None]] = []  # connections kept apart (storage/direct.py)
        self._watcher: sqlite3.Connection | None = None  # for `changed` (SQLite)
        self._listener: ChangeListener | None = None  # for `changed` (PostgreSQL)
        self._seen_version: int | None = None
        if self.dialect == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                raise StorageError("fsched needs an SQLite file, not an in-memory database")
            try:
                _prepare_sqlite_file(Path(parsed.database))
            except OSError as exc:  # no access to the folder or file: the OS's answer, in one line
                raise StorageError(
                    f"cannot use database file {parsed.database}: {exc.strerror or exc}"
                ) from None
        try:
            # pre_ping: a connection the server closed (restart, timeout) is replaced, not used.
            # A pool as big as the HTTP server's worker threads use at once: connections beyond
            # the pool are opened and closed per call (a quarter of a busy server's CPU, measured).
            self.engine = create_engine(self.url, pool_pre_ping=self.dialect != "sqlite",
                                        pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)
        except (ArgumentError, ImportError) as exc:
            raise StorageError(f"cannot use database {self.url!r}: {exc}") from None
        if self.dialect == "sqlite":
            _wire_sqlite(self.engine, busy_timeout_ms)
        elif self.dialect == "postgresql":
            _wire_postgresql(self.engine)

    def now(self) -> ColumnElement[float]:
        """SQL for the database's clock in Unix seconds (`database_clock`)."""
        return database_clock()

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._translate_errors(), self.engine.connect() as conn, conn.begin():
            yield conn

    def rows(self, prepared: Prepared, params: Mapping[str, object] | None = None) -> list:
        """A `Prepared` read's rows (named tuples of its columns, values read as SQLAlchemy reads them), run
        on a pooled driver connection with no transaction around it: no SQLAlchemy Connection, no BEGIN, no
        COMMIT, which cost more than a short read itself (a single SELECT sees one snapshot on its own;
        the pool returns the connection rolled back). About 40% of a read through `read()` on
        PostgreSQL, measured."""
        compiled, bound = prepared.bound(self.engine.dialect, params)
        return self._on_driver(compiled.sql, bound, compiled.rows)

    def _on_driver(self, sql: str, args, read: Callable):
        """`read(cursor)` after the statement ran on a pooled driver connection, no transaction around it."""
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            raw = self.engine.raw_connection()
        except DBAPIError as exc:  # the pool's own (a connection refused): the one clear error
            raise self.failure(exc.orig if exc.orig is not None else exc) from exc
        try:
            cursor = raw.cursor()
            try:
                cursor.execute(sql, args)
                return read(cursor)
            finally:
                cursor.close()
        except dbapi.Error as exc:
            raw.invalidate(exc)  # a lost or broken connection is not handed out again
            raise self.failure(exc) from exc
        finally:
            raw.close()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        with self._translate_errors(), self.engine.connect() as conn:
            conn.execution_options(fsched_write=True)
            with conn.begin():
                if self.dialect == "postgresql":  # the short limit, for this transaction only
                    conn.exec_driver_sql(
                        f"SET LOCAL idle_in_transaction_session_timeout = {int(PG_IDLE_IN_TRANSACTION_MS)}")
                yield conn

    def errors_translated(self):
        """`_translate_errors` for a connection kept apart (storage/kept.py)."""
        return self._translate_errors()

    @contextmanager
    def _translate_errors(self) -> Iterator[None]:
        """Turn driver failures (locked, read-only, disk full) into one clear error."""
        try:
            yield
        except OperationalError as exc:
            raise self.failure(exc.orig if exc.orig is not None else exc) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StorageError(f"database {self.display_url}: connection lost") from exc
            raise

    def failure(self, error: BaseException) -> StorageError:
        """The one clear error for a driver's failure (locked, read-only, disk full, connection lost)."""
        reason = str(error).strip()
        if self.dialect == "sqlite" and any(word in reason for word in _IO_WORDS):
            reason += storage_hint(Path(make_url(self.url).database))
        return StorageError(f"database {self.display_url}: {reason}")

    def changed(self) -> bool:
        """Whether any connection but the watcher's committed since the last call (True the first
        time): SQLite's `data_version`, one pragma on a connection kept for it; on PostgreSQL whether a
        change a sync reads was notified, or a second has passed (storage/changes.py)."""
        if self.dialect == "postgresql":
            if self._listener is None:
                self._listener = ChangeListener(self.driver_connection)
            return self._listener.changed(time.monotonic())
        if self.dialect != "sqlite":
            return True
        if self._watcher is None:
            self._watcher = sqlite3.connect(make_url(self.url).database, check_same_thread=False)
        try:
            version = self._watcher.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return True  # cannot tell: look
        changed, self._seen_version = version != self._seen_version, version
        return changed

    def on_dispose(self, close: Callable[[], None]) -> None:
        """Call `close` first when the Database is disposed (what keeps connections of its own)."""
        self._on_dispose.append(close)

    def dispose(self) -> None:
        for close in self._on_dispose:
            close()
        self.engine.dispose()
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def driver_connection(self):
        """A driver connection of its own, outside the pool (the change listener's): a server that does
        not answer is given up on after a few seconds (the daemon's loop waits for it)."""
        args, kwargs = self.engine.dialect.create_connect_args(make_url(self.url))
        if self.dialect == "postgresql":
            kwargs.setdefault("connect_timeout", LISTENER_CONNECT_TIMEOUT_S)
        return self.engine.dialect.loaded_dbapi.connect(*args, **kwargs)

    def reclaim_space(self, vacuum_tables: tuple[str, ...] = ()) -> None:
        """After a large delete: on SQLite, give the free pages back to the file system, VACUUM_PAGES a
        transaction (each a short write lock), and cut the WAL back (a checkpoint that readers hold up
        does what it can; the next one does the rest). On PostgreSQL deleted rows' space is reused by
        the table's next writes once vacuumed: autovacuum's business, or a VACUUM of `vacuum_tables`
        now (it takes no lock that stops reads or writes)."""
        if self.dialect == "postgresql" and vacuum_tables:
            with self._translate_errors(), self.engine.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                for table in vacuum_tables:
                    conn.exec_driver_sql(f"VACUUM (SKIP_LOCKED) {table}")  # another in progress: its work
            return
        if self.dialect != "sqlite":
            return
        with self._translate_errors(), self.engine.connect() as conn:
            raw = conn.connection.driver_connection  # outside any transaction: these pragmas need it
            if raw.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                _switch_to_incremental_vacuum(raw)  # the upgrade could not (the file was busy)
            while raw.execute("PRAGMA freelist_count").fetchone()[0] > 0:
                before = raw.execute("PRAGMA freelist_count").fetchone()[0]
                # run to its end (execute would step it once), a bounded number of pages a transaction
                raw.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES});")
                if raw.execute("PRAGMA freelist_count").fetchone()[0] >= before:
                    break  # nothing moved (another connection holds the file): the next call goes on
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def make_space_reclaimable(self) -> None:
        """On SQLite, switch a file made before incremental vacuum to it: a VACUUM, once, at upgrade.
        Best effort: while other processes hold the file it is left to the next delete of a file."""
        if self.dialect != "sqlite":
            return
        with self._translate_errors(), self.engine.connect() as conn:
            raw = conn.connection.driver_connection
            if raw.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                _switch_to_incremental_vacuum(raw)

    def daemon_lock(self) -> DaemonLock | None:
        """On SQLite, make this process the job table's only daemon (None on PostgreSQL).

        An advisory lock on a file beside the database: the kernel releases
        it when the process dies, however it dies, so a crashed daemon never
        blocks its successor.
        """
        if self.dialect != "sqlite":
            return None
        path = Path(make_url(self.url).database + ".daemon.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            hint = storage_hint(path)
            raise StorageError(f"cannot open the daemon lock {path}: {exc.strerror}{hint}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StorageError(
                f"another fsched daemon (pid {holder}) is already running on {self.display_url}; "
                "one daemon per SQLite job table (several daemons need PostgreSQL)"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:
            os.close(fd)
            hint = storage_hint(path)
            raise StorageError(f"cannot write the daemon lock {path}: {exc.strerror}{hint}") from None
        return DaemonLock(fd)


def _switch_to_incremental_vacuum(raw) -> bool:
    """Rewrite an SQLite file for incremental vacuum (VACUUM); False when others hold it now."""
    try:
        raw.execute("PRAGMA auto_vacuum = INCREMENTAL")
        raw.execute("VACUUM")
        return True
    except sqlite3.OperationalError:  # locked or busy past the timeout: a later call tries again
        return False


class DaemonLock:
    def __init__(self, fd: int):
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
