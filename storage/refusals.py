"""When the table refuses one request's data: that request fails, the others are written.

The daemon writes many requests' output in one statement (PostgreSQL) or
one executemany (SQLite). Should the
database refuse a value (PostgreSQL's "text fields cannot contain NUL",
"invalid input syntax for type json", a driver that cannot encode a string),
the whole transaction fails; written again and again, that one request would
stop the daemon and, claimed by the next, every daemon in turn. So a refused
write is done again with each row under its own savepoint: the rows the
table takes are written, and each one it refuses ends `failed` with the
table's reason, in the same transaction. The common path pays nothing: the
savepoints are taken only after a refusal.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Sequence

from sqlalchemy.exc import DataError, StatementError

from fsched.storage.direct import Tx
from fsched.storage.prepared import Prepared, Refused

REFUSED_PREFIX = "the job table refused this request's output"


def _driver_data_error(exc: BaseException) -> bool:
    """The drivers' own DataError (a statement run on the driver directly: storage/direct.py). PostgreSQL's
    driver is asked only once loaded (a PostgreSQL table loads it): a SQLite daemon never imports it."""
    psycopg = sys.modules.get("psycopg")
    return isinstance(exc, sqlite3.DataError) or (psycopg is not None and isinstance(exc, psycopg.DataError))


def is_refusal(exc: BaseException) -> bool:
    """A value the table (or its driver) would not take, as opposed to a table that cannot be written."""
    if isinstance(exc, DataError | UnicodeError | Refused) or _driver_data_error(exc):
        return True
    # A value that failed to bind (a type's processor or the driver raised before the statement ran).
    return (isinstance(exc, StatementError) and not hasattr(exc, "connection_invalidated")
            and isinstance(exc.orig, ValueError | TypeError | UnicodeError))


def refusal_message(exc: BaseException) -> str:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
    return f"{REFUSED_PREFIX} ({reason}); it was failed so that the other requests go on"


def write_each(tx: Tx, statement: Prepared, writes: Sequence[dict],
               also: Callable[[Tx, dict], None] | None = None) -> dict[int, str]:
    """Run `statement` for each write under its own savepoint (and `also(tx, write)`, the rest of
    that request's write); the refused ones' ids (`b_id`), with why."""
    refused: dict[int, str] = {}
    for write in writes:
        try:
            with tx.savepoint():
                tx.many(statement, [write])
                if also is not None:
                    also(tx, write)
        except Exception as exc:  # noqa: BLE001 - only refusals are kept; anything else propagates
            if not is_refusal(exc):
                raise
            refused[write["b_id"]] = refusal_message(exc)
    return refused
