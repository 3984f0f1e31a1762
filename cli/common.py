"""What every command shares: the --db option, opening the store, errors, JSON."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from fsched.core.jobs.access import Actor
    from fsched.core.jobs.limits import InputLimits
    from fsched.core.ports.catalog import CatalogStore
    from fsched.core.ports.table import Table
    from fsched.core.sim.trace import TraceRequest

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="SQLAlchemy URL or SQLite file path of the job table "
        "(default: $FSCHED_DB, else $XDG_DATA_HOME/fsched/fsched.db)",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"fsched: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def note(message: str) -> None:
    print(message, file=sys.stderr)


def read_trace(path: str | Path, **options: Any) -> list[TraceRequest]:
    """`load_trace`'s requests, what it left out (its TraceWarnings) told as one note each."""
    import warnings

    from fsched.core.sim.trace import TraceWarning, load_trace

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        requests = load_trace(path, **options)
    for warning in caught:
        if issubclass(warning.category, TraceWarning):
            note(f"fsched: note: {warning.message}")
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return requests


def handle_errors(command: Callable) -> Callable:
    """Turn the errors a user can act on into one stderr line and a non-zero exit."""
    from fsched.core.jobs.jobfile import JobFileError
    from fsched.core.ports.records import StoreError

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (UserError, StoreError, JobFileError, ValueError) as exc:
            fail(str(exc))
        except BrokenPipeError:
            # `fsched results 3 | head` closed our stdout; that is not an error.
            sys.stderr.close()
            raise typer.Exit(0) from None

    return wrapper


def open_table(db: str | None) -> Table:
    """The job table named by --db (or the default), its stores made as a command uses them (`memory:NAME`:
    this process's in-memory table, what tests run the commands over)."""
    from fsched.storage.stores import open_table as open_job_table

    return open_job_table(db)


def open_catalog(db: str | None) -> CatalogStore:
    """The commands' side of the job table: submit, list, results, cancel, tenants, daemons."""
    return open_table(db).catalog


def acting_user(store: CatalogStore) -> Actor:
    """Who runs this command, and whether they are an fsched admin of this job table."""
    from fsched.core.jobs.access import local_actor

    return local_actor(store.file_owner())


def allow(refusal: str | None) -> None:
    """Go on if an access decision (core/jobs/access.py) allowed it; else stop with its reason."""
    if refusal is not None:
        raise UserError(refusal)


def open_table_as_admin(db: str | None, doing: str) -> Table:
    """The job table, for a command only an fsched admin may run (`doing` names it in the refusal)."""
    from fsched.core.jobs.access import may_administer

    table = open_table(db)
    allow(may_administer(acting_user(table.catalog), doing))
    return table


def open_catalog_as_admin(db: str | None, doing: str) -> CatalogStore:
    """The catalog, for a command only an fsched admin may run (`doing` names it in the refusal)."""
    return open_table_as_admin(db, doing).catalog


def open_table_to_serve(db: str | None, doing: str) -> Table:
    """The job table, for a process that reads every tenant's work (`fsched daemon`, `fsched serve`).

    On a shared SQLite file that is an admin's job. On PostgreSQL, holding
    the database URL's credentials is what lets a daemon or a server in.
    """
    table = open_table(db)
    if table.sqlite:
        from fsched.core.jobs.access import may_administer

        allow(may_administer(acting_user(table.catalog), doing))
    return table


def known_tool_parser(name: str) -> str:
    """A `--tool-call-parser` value: a known family's name or `auto`; a UserError otherwise."""
    from fsched.core.openai.toolcalls.families import PARSER_NAMES

    if name not in PARSER_NAMES:
        raise UserError(f"--tool-call-parser: one of {', '.join(PARSER_NAMES)}, not {name!r}")
    return name


def limits_in_force(table: Table) -> InputLimits:
    """The limits a submitting command applies: the stored ones, lowered by this command's environment."""
    import os

    from fsched.core.jobs.limits import limits_in_force as limits_of

    return limits_of(table.keys.stored_limits(), os.environ)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


def iso_time(at: float | None) -> str | None:
    """Unix seconds as an ISO 8601 UTC time, to the second."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# The collector's first generation runs once this many objects are allocated and not freed (Python's
# default: 700). Each request allocates thousands for a few ms and a thousand streams hold theirs for
# seconds, so at 700 the young collections ran every few requests and promoted the live streams'
# objects to be traversed again and again: measured at 1,024 streams of 8-token requests, serve's
# CPU per token went from 126 µs (the heap frozen, 700) to 112 (20,000). The memory it may hold
# meanwhile is what 20,000 small objects take (a few MB).
YOUNG_GC_THRESHOLD = 20_000


# How long a thread holds the GIL while another waits for it (Python's default: 5 ms). serve's event loop
# runs a burst's requests for tens of milliseconds at a stretch, and the group commit's thread, woken
# by the first of them, waited up to the whole interval to start its transaction: at 32 streams of
# the paced engine (20 ms a step, 2 cores) a request's way from serve's reading of its head to its
# stream to the engine took 10.4 ms p50 (median of six runs) at 5 ms, 6.5 at 0.5 ms. A loop
# callback takes a fraction of a millisecond, so the waiting thread gets its turn within one or two.
THREAD_HANDOFF_S = 0.0005


def quick_thread_handoffs() -> None:
    """A thread woken in a long-running process (serve, the daemon) gets the GIL within THREAD_HANDOFF_S
    of asking, not the default's 5 ms."""
    sys.setswitchinterval(THREAD_HANDOFF_S)


def quiet_gc() -> None:
    """What the collector traverses kept to what requests make, in a long-running process (serve, the
    daemon) once it has started: the heap built at startup (its imports, the app or the tokenizer:
    hundreds of thousands of objects that live as long as the process) is frozen out of every
    collection, and young collections wait for YOUNG_GC_THRESHOLD objects. Measured at 1,024 streams
    of 8-token requests: serve's CPU per token 157-168 µs before, 112-115 after (a third of a
    request's fixed cost was the collector traversing the same long-lived objects)."""
    import gc

    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)
