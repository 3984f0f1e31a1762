"""A Core statement compiled once per dialect and run on a DBAPI cursor (storage/direct.py).

SQLAlchemy's way to a statement (the compiled-cache lookup, the parameters'
processing, the events, a result object) cost the daemon ten to thirty times
what the driver itself does for its short statements, every time (measured
on SQLite: 69 µs for a one-statement read, 2.4 µs on the driver). The
statements are still written in SQLAlchemy Core, from the models; `Prepared`
compiles one once for a dialect and keeps what running it needs: its SQL,
its parameters in the order the driver takes them, the types' processors
(JSON, the text codec, PostgreSQL's casts), and its result's columns.

A statement that names a list (`listed`: `IN` a list of ids) is a function of
the list's length: one is compiled for each power of two, the list padded by
repeating its last id (an `IN` list reads the same), so a handful of
variants serve every length. On PostgreSQL the list is one array parameter
(`= ANY`), one variant for every length: the driver rewrites a statement's
parameters into the server's form at every execution, and keeps that work
only for statements of at most 50 parameters, so an `IN` list of 64 ids or
more was rewritten afresh each time (5-8% of a daemon's CPU on PostgreSQL at
256 online streams of 2 tokens, measured with py-spy: the step's read of
the rows it holds, the claim's lease, the lock of the jobs it moves).

A statement run for many rows in a write (`Batched`) is, on PostgreSQL, one
statement that reads its rows from one parameter, a JSON array of them
(`json_to_recordset`): a process stopped while sending it never leaves a
write half sent, and the server parses, plans and runs it once; elsewhere it
is the row statement, run once a row (executemany).

Compiling is the dear part (a few milliseconds a variant in SQLAlchemy's
compiler), so a daemon compiles every statement and every variant up to its
batch when it starts (`compile_ahead`): otherwise its first steps paid for it,
a new length at a time (23% of a fresh daemon's CPU while it relayed its
first 6,144 tokens to 32 streams, measured with py-spy).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from sqlalchemy import ARRAY, JSON, any_, bindparam, func, literal_column
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlalchemy.types import TypeDecorator, TypeEngine

ROWS = "b_rows"  # the parameter of a `Batched` statement's rows (a list of the row statement's parameters)
_ALL = -1  # the variant of a `Batched` statement that writes all its rows at once
_ARRAY = -2  # PostgreSQL's variant of a listed statement: its list one array parameter


class Refused(ValueError):
    """A value a column's type would not take (its processor raised): the table refused it."""


def listed(column: ColumnElement, name: str, n: int) -> ColumnElement:
    """`column IN` n parameters, `{name}_0` ... (what a `Prepared` built of a length fills in); in
    PostgreSQL's variant, `column = ANY` one array parameter, `name`."""
    if n == _ARRAY:
        return column == any_(bindparam(name, type_=ARRAY(column.type)))
    return column.in_([bindparam(f"{name}_{i}") for i in range(n)])


def one_of(column: ColumnElement, values: Sequence[str]) -> ColumnElement:
    """`column IN` these constants, written into the statement (`column.in_(values)` makes one parameter
    of the list, expanded at each execution: not a statement compiled once). Written in, not bound:
    PostgreSQL's generic plan of a prepared statement (the plan it may keep after five runs) knows a
    parameter's type only, so with `jobs.state IN ($1, $2, $3)` the claim's read of the jobs with work
    had to read every job the table holds (20,003 rows for 3 queued jobs behind 20,000 finished ones,
    tests/integration/test_pg_generic_plans.py); with the states in the text, the index on the state."""
    for value in values:
        if not _CONSTANT.fullmatch(value):
            raise ValueError(f"not a constant one_of writes into a statement: {value!r}")
    return column.in_([literal_column(f"'{value}'", column.type) for value in values])


_CONSTANT = re.compile(r"[a-z_]+")  # what a state's name is made of: nothing to quote


class _Rows(TypeDecorator):
    """A list of rows (dicts) as one JSON array, each named value processed as its column's type would be
    (a JSON value nested as it is)."""

    impl = JSON
    cache_ok = True

    def __init__(self, columns: tuple[tuple[str, TypeEngine], ...]):
        super().__init__()
        self.columns = columns
        self._processors: dict[str, list[tuple[str, Callable]]] = {}

    def process_bind_param(self, rows, dialect):
        processors = self._processors.get(dialect.name)
        if processors is None:
            processors = self._processors[dialect.name] = [
                (name, process) for name, type_ in self.columns if not isinstance(type_, JSON)
                and (process := type_.dialect_impl(dialect).bind_processor(dialect)) is not None
            ]
        if not processors:
            return rows
        return [{**row, **{name: process(row[name]) for name, process in processors}} for row in rows]


def recordset(*columns: ColumnElement, param: str = ROWS, name: str = "v") -> TableValuedAlias:
    """The rows of parameter `param` as a table `name` of these columns (`column(name, type)`, each a name
    of the rows' dicts): what a `Batched` statement reads (PostgreSQL)."""
    rows = bindparam(param, type_=_Rows(tuple((c.name, c.type) for c in columns)))
    return func.json_to_recordset(rows).table_valued(*columns).render_derived(name, with_types=True)


class Prepared:
    """A statement (or, given `listed`, a function of a list's length that builds it), compiled on first
    use for each dialect."""

    __slots__ = ("_build", "_listed", "_variants")

    def __init__(self, statement: Any, listed: str | None = None):
        self._build = statement if listed is not None else (lambda n: statement)
        self._listed = listed
        self._variants: dict[tuple[str, int], _Compiled] = {}

    def compile_ahead(self, dialect: Dialect, largest: int) -> None:
        """Compile now what running it for lists of up to `largest` values would."""
        if self._listed is None:
            self._variant(dialect, 0)
            return
        if dialect.name == "postgresql":
            self._variant(dialect, _ARRAY)
            return
        n = 1
        while n <= _size(max(largest, 1)):
            self._variant(dialect, n)
            n *= 2

    def bound(self, dialect: Dialect, params: Mapping[str, Any] | None) -> tuple[_Compiled, Any]:
        """The compiled variant for these parameters, and the parameters as its driver takes them."""
        params = params or {}
        n = 0
        if self._listed is not None:
            values = params[self._listed]
            n = _size(len(values))  # (an empty list is refused on both dialects)
            if dialect.name == "postgresql":
                n, params = _ARRAY, {**params, self._listed: list(values)}
            else:
                params = {**params, **_spread(self._listed, values, n)}
        compiled = self._variant(dialect, n)
        return compiled, compiled.driver_params(params)

    def compiled(self, dialect: Dialect, n: int = 0) -> _Compiled:
        """The variant of a list of (padded) length `n`, for statements run many times over one list."""
        return self._variant(dialect, n)

    def _variant(self, dialect: Dialect, n: int) -> _Compiled:
        key = (dialect.name, n)
        found = self._variants.get(key)
        if found is None:
            found = self._variants[key] = _Compiled(self._build(n), dialect)
        return found


class Batched(Prepared):
    """A statement run for many rows in a write (`Tx.many`): `each` for one row's parameters and, on
    PostgreSQL, `together` for all of them at once (reading them from a `recordset`)."""

    __slots__ = ()

    def __init__(self, each: Any, together: Any):
        super().__init__(each)
        self._build = lambda n: together if n == _ALL else each

    def compile_ahead(self, dialect: Dialect, largest: int) -> None:
        self._variant(dialect, _ALL if dialect.name == "postgresql" else 0)

    def together(self, dialect: Dialect) -> _Compiled:
        """The statement that writes all the rows: run with `{ROWS: [row's parameters, ...]}`."""
        return self._variant(dialect, _ALL)


def statements_of(*modules: ModuleType) -> list[Prepared]:
    """The statements these modules define (at module level: compiled once for the process's life)."""
    return [value for module in modules for value in vars(module).values() if isinstance(value, Prepared)]


def _size(n: int) -> int:
    """The padded length of a list of n: the next power of two (one variant per power)."""
    if n < 1:
        raise ValueError("a listed statement needs at least one value")
    return 1 << (n - 1).bit_length()


def _spread(name: str, values: Sequence, size: int) -> dict[str, Any]:
    last = values[-1]
    return {f"{name}_{i}": values[i] if i < len(values) else last for i in range(size)}


class _Compiled:
    """One compiled statement: its SQL, its parameters' order and processing, its result's shape."""

    __slots__ = ("sql", "dialect", "_order", "_defaults", "_processors", "_columns", "_row", "_readers",
                 "_positional", "_binds")

    def __init__(self, statement: Any, dialect: Dialect):
        compiled = statement.compile(dialect=dialect)
        if any(bind.expanding for bind in compiled.bind_names):
            raise ValueError("a prepared statement's lists are `listed` (or `one_of` for constants), "
                             "not expanded at each execution")
        self.sql = compiled.string
        self.dialect = dialect
        self._positional = compiled.positional
        names = compiled.bind_names  # each bound parameter -> its name in the SQL
        self._binds = names
        self._order = tuple(compiled.positiontup) if compiled.positional else tuple(names.values())
        self._defaults = {name: bind.effective_value for bind, name in names.items()
                          if not bind.required and bind.callable is None}
        self._processors = {}
        for bind, name in names.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self._processors[name] = process
        # What it returns (a select's columns, or an UPDATE's RETURNING): rows of these, by name.
        returned = statement.exported_columns
        self._columns = list(returned)
        self._row = namedtuple("Row", returned.keys(), rename=True) if self._columns else None
        self._readers: list[tuple[int, Callable]] | None = None

    def parameter_types(self) -> dict[str, str]:
        """Each parameter by its name in the SQL: the database's type for it, as the statement binds it
        ("unknown" for one SQLAlchemy leaves untyped: the database infers it from its place)."""
        d = self.dialect
        return {name: "unknown" if bind.type._isnull else bind.type.dialect_impl(d).compile(dialect=d)
                for bind, name in self._binds.items()}

    def driver_params(self, params: Mapping[str, Any]) -> Any:
        """The statement's parameters, processed, in the form its driver takes (a tuple or a dict)."""
        values = {**self._defaults, **params} if self._defaults else params
        processors = self._processors
        try:
            if self._positional:
                return tuple([processors[name](values[name]) if name in processors else values[name]
                              for name in self._order])
            return {name: processors[name](values[name]) if name in processors else values[name]
                    for name in self._order}
        except (ValueError, TypeError, UnicodeError) as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc

    def with_values(self, rows: Sequence[Any], name: str, values: Sequence[Any]) -> list:
        """Rows as `driver_params` made them, each with the parameter `name` set to its value in `values`
        (one bound as it is, such as an id): rows made before a transaction, finished in it."""
        if name in self._processors:
            raise ValueError(f"{name} is processed when bound: make its rows with driver_params")
        if self._positional:
            at = self._order.index(name)
            return [(*row[:at], value, *row[at + 1:]) for row, value in zip(rows, values, strict=True)]
        return [{**row, name: value} for row, value in zip(rows, values, strict=True)]

    def rows(self, cursor) -> list:
        """The rows the cursor holds, each a named tuple of the statement's columns, values processed as
        SQLAlchemy would (JSON read, the text codec undone)."""
        return self._processed(self._fetched(cursor))

    def unread_rows(self, cursor) -> list:
        """The rows the cursor holds as the driver gave them (JSON and encoded text not read yet: `read`
        reads them), each a named tuple of the statement's columns."""
        make = self._row._make
        return [make(row) for row in self._fetched(cursor)]

    def read(self, rows: Sequence) -> list:
        """`unread_rows`' rows with their values processed, as `rows` gives them (the same rows where no
        column needs reading: they are named tuples already)."""
        return self._processed(rows) if self._readers else list(rows)

    def _fetched(self, cursor) -> list:
        fetched = cursor.fetchall()
        if self._readers is None:
            self._readers = self._result_readers(cursor.description)
        return fetched

    def _processed(self, fetched: Sequence) -> list:
        make = self._row._make
        readers = self._readers
        if not readers:
            return [make(row) for row in fetched]
        out = []
        for row in fetched:
            row = list(row)
            for i, read in readers:
                if row[i] is not None:
                    row[i] = read(row[i])
            out.append(make(row))
        return out

    def _result_readers(self, description) -> list[tuple[int, Callable]]:
        """Each column's result processor, for the type the driver described (read at the first rows)."""
        readers = []
        for i, (column, described) in enumerate(zip(self._columns, description or (), strict=False)):
            process = column.type.dialect_impl(self.dialect).result_processor(self.dialect, described[1])
            if process is not None:
                readers.append((i, process))
        return readers
