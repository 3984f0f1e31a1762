"""Whether a PostgreSQL job table may have changed since a daemon last looked, without a query.

A daemon syncs (weights, cancels, new work) only when the table may have
changed: on SQLite it reads the file's change counter (`PRAGMA data_version`,
storage/db.py). On PostgreSQL it had no such check and looked every time:
its three reads ten times a second whatever happened, and an idle daemon's
claim at every 20 ms pass (15.7-18.1 ms of CPU a second idle, measured;
9.8 with this check).

Here the tables whose changes a sync reads notify a channel when a
statement changes them (PostgreSQL's NOTIFY, from a statement-level trigger,
sent at commit and only if it commits): new requests and any change of a
request's state (a submit, a cancel, a requeue, a claim, an end), a job's
cancel or state, and any change of the tenants (weights). A daemon keeps one
connection listening, and the check drains what arrived: no statement. The
rest of a commit (tokens written, heartbeats) notifies nothing.

A look is still forced once every `FORCE_S`, as SQLite's check is by the
heartbeat's own commit: what may change a claim without a notice (a limit
changed, a table made some other way) is seen within it. A listener that
cannot connect, finds the triggers missing or fails says "may have
changed" every time, as before.
"""

from __future__ import annotations

import contextlib

from sqlalchemy import DDL, Table, event

CHANNEL = "fsched_queue"
FORCE_S = 1.0
_FUNCTION = "fsched_notify_change"
# The tables whose changes a sync reads, and the statements on each that notify.
NOTIFYING = {
    "requests": "INSERT OR UPDATE OF state OR DELETE",
    "jobs": "UPDATE OF state, cancel_requested_at OR DELETE",
    "tenants": "INSERT OR UPDATE OR DELETE",
}


def trigger_name(table: str) -> str:
    return f"fsched_notice_{table}"


def function_sql() -> str:
    return (f"CREATE OR REPLACE FUNCTION {_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$")


def trigger_sql(table: str) -> list[str]:
    """The statements that make `table` notify (replacing a trigger of the same name)."""
    name = trigger_name(table)
    return [function_sql(), f"DROP TRIGGER IF EXISTS {name} ON {table}",
            f"CREATE TRIGGER {name} AFTER {NOTIFYING[table]} ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {_FUNCTION}()"]


def trigger_statements() -> list[tuple[str, str]]:
    """(table, statement) for every table that notifies: what gives an existing table its triggers."""
    return [(table, sql) for table in NOTIFYING for sql in trigger_sql(table)]


def notify_on_create(tables: dict[str, Table]) -> None:
    """Give these tables their triggers whenever they are created on PostgreSQL (`create_all`)."""
    for table, sql in trigger_statements():
        event.listen(tables[table], "after_create", DDL(sql).execute_if(dialect="postgresql"))


class ChangeListener:
    """One connection that listens on the channel; `changed` tells whether a notice came since its last
    call (or a look is due anyway). `connect` makes the DBAPI connection (psycopg, not in a transaction)."""

    def __init__(self, connect, force_s: float = FORCE_S):
        self._connect = connect
        self.force_s = force_s
        self._conn = None
        self._looked_at = float("-inf")
        self._retry_at = float("-inf")  # after a failed connect, the next try (not one at every pass)
        self.usable = True  # False once the triggers were found missing: every call says True

    def changed(self, now: float) -> bool:
        if not self.usable:
            return True
        if self._conn is None:
            if now >= self._retry_at and not self._listen():
                self._retry_at = now + self.force_s
            self._looked_at = now
            return True  # what changed before it listened is unknown: look
        noticed = False
        try:
            for _ in self._conn.notifies(timeout=0):  # all that came: what is left would say so again
                noticed = True
        except Exception:  # noqa: BLE001 - a lost connection: listen again at the next call, look now
            self.close()
            return True
        if noticed or now - self._looked_at >= self.force_s:
            self._looked_at = now
            return True
        return False

    def _listen(self) -> bool:
        """Connect and listen; False when it could not (tried again `force_s` later)."""
        try:
            conn = self._connect()
        except Exception:  # noqa: BLE001 - cannot listen now: the caller looks, and this tries again
            return False
        try:
            conn.autocommit = True
            found = conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname = ANY(%s)",
                                 ([trigger_name(t) for t in NOTIFYING],)).fetchone()[0]
            if found < len(NOTIFYING):
                self.usable = False
            else:
                conn.execute(f"LISTEN {CHANNEL}")
                self._conn = conn
                return True
        except Exception:  # noqa: BLE001 - as above
            pass
        with contextlib.suppress(Exception):
            conn.close()
        return False

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
