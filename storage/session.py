"""Statements a PostgreSQL connection prepares for its session (SQL's PREPARE), then runs by name inside
one query of the simple protocol.

A query of the simple protocol can carry several statements (storage/kept.py
sends a group commit's BEGIN, statements and COMMIT as one), and the server
has all of it before it runs any. But the server parses and plans such a
query's statements every time, where the extended protocol's prepared
statements are planned once: for a group commit of one online request that
was 0.4 ms for the tenants' lock and 0.6 for the store, beside 1 ms of work
(EXPLAIN ANALYZE). A statement prepared once for the session and `EXECUTE`d
with its parameters as literals is planned once and still goes in one query.

Its parameters are declared with the types the statement binds them as (left
to the server, a literal's type comes from where it stands: `SELECT $1 AS
flag` would take a boolean as text). A statement the server cannot prepare (a
parameter whose type it cannot tell) is sent as text. A PREPARE outlives a
rolled-back transaction, but psycopg answers a ROLLBACK with DEALLOCATE ALL
when it has prepared statements of its own on the connection: after a
rollback the statements are prepared again (one still there is taken as it
is). Where a prepared statement is gone in a later transaction although no
rollback came between (a pooler in transaction mode, such as PgBouncer's,
gives each transaction another server session), its writer
(storage/kept.py) prepares nothing more and sends every statement as text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import ClientCursor

from fsched.storage.prepared import _Compiled

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_FORMS: dict[str, tuple[str, str]] = {}  # a statement's SQL -> (its PREPARE, its EXECUTE), for any session


class SessionStatements:
    """One connection's prepared statements (a new connection, a new instance)."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self._quote = ClientCursor(raw)  # literals for EXECUTE's arguments
        self._ready: dict[str, str] = {}  # SQL prepared on this session -> its EXECUTE
        self.stale = True  # prepare (again) before the next transaction

    def prepare_all(self, statements: Sequence[_Compiled]) -> None:
        """Prepare these statements now, outside any transaction, in one round trip (if one fails, the
        others one by one)."""
        forms = {c.sql: _form(c) for c in statements}
        self._ready.clear()
        self.stale = False
        if not forms:
            return
        try:
            self._raw.execute("; ".join(prepare for prepare, _ in forms.values()))
            self._ready = {sql: execute for sql, (_, execute) in forms.items()}
            return
        except psycopg.errors.ProgrammingError:
            pass
        for sql, (prepare, execute) in forms.items():
            try:
                self._raw.execute(prepare)
            except psycopg.errors.DuplicatePreparedStatement:  # still there (a rollback kept it)
                pass
            except psycopg.errors.ProgrammingError:  # sent as text
                continue
            self._ready[sql] = execute

    def by_name(self, compiled: _Compiled, bound: Any) -> str | None:
        """The statement with these (driver's) parameters as one EXECUTE, for a query of the simple
        protocol; None for one this session did not prepare (to send as it is)."""
        execute = None if self.stale else self._ready.get(compiled.sql)
        return None if execute is None else self._quote.mogrify(execute, bound)

    def forget(self) -> None:
        """After a rollback (see the module's docstring)."""
        self.stale = True


def literal_text(raw, sql: str, bound: Any) -> str:
    """The statement with these (driver's) parameters written in as literals: a query of the simple
    protocol, parsed and planned by the server each time."""
    return ClientCursor(raw).mogrify(sql, bound)


def _form(compiled: _Compiled) -> tuple[str, str]:
    """A statement's PREPARE (its parameters numbered and typed) and its EXECUTE (theirs as placeholders)."""
    sql = compiled.sql
    if sql not in _FORMS:
        types = compiled.parameter_types()
        names: list[str] = []

        def number(match: re.Match) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        name = "fsched_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
        body = _PLACEHOLDER.sub(number, sql).replace("%%", "%")
        typed = f" ({', '.join(types[n] for n in names)})" if names else ""
        arguments = f"({', '.join(f'%({n})s' for n in names)})" if names else ""
        _FORMS[sql] = (f"PREPARE {name}{typed} AS {body}", f"EXECUTE {name}{arguments}")
    return _FORMS[sql]
