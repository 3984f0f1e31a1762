"""When the table refuses one request's data: that request fails, the others are written.

The daemon writes many requests' output in one executemany. Should the
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

from collections.abc import Callable, Sequence

from sqlalchemy import Connection
from sqlalchemy.exc import DataError, StatementError

REFUSED_PREFIX = "the job table refused this request's output"


def is_refusal(exc: BaseException) -> bool:
    """A value the table (or its driver) would not take, as opposed to a table that cannot be written."""
    if isinstance(exc, DataError | UnicodeError):
        return True
    # A value that failed to bind (a type's processor or the driver raised before the statement ran).
    return (isinstance(exc, StatementError) and not hasattr(exc, "connection_invalidated")
            and isinstance(exc.orig, ValueError | TypeError | UnicodeError))


def refusal_message(exc: BaseException) -> str:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
    return f"{REFUSED_PREFIX} ({reason}); it was failed so that the other requests go on"


def write_each(conn: Connection, statement, writes: Sequence[dict],
               also: Callable[[Connection, dict], None] | None = None) -> dict[int, str]:
    """Run `statement` for each write under its own savepoint (and `also(conn, write)`, the rest of
    that request's write); the refused ones' ids (`b_id`), with why."""
    refused: dict[int, str] = {}
    for write in writes:
        try:
            with conn.begin_nested():
                conn.execute(statement, [write])
                if also is not None:
                    also(conn, write)
        except Exception as exc:  # noqa: BLE001 - only refusals are kept; anything else propagates
            if not is_refusal(exc):
                raise
            refused[write["b_id"]] = refusal_message(exc)
    return refused
