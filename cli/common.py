"""What every command shares: the --db option, opening the store, errors, JSON."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from fsched.core.jobs.access import Actor
    from fsched.storage.base import SqlStoreBase
    from fsched.storage.sql_catalog import SqlCatalogStore
    from fsched.storage.sql_queue import SqlQueueStore

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


def open_catalog(db: str | None) -> SqlCatalogStore:
    """The commands' side of the job table: submit, list, results, cancel, tenants, daemons."""
    from fsched.storage.sql_catalog import SqlCatalogStore

    return SqlCatalogStore(db)


def open_queue(db: str | None) -> SqlQueueStore:
    """The daemon's side of the job table: claim, write back, leases, heartbeats."""
    from fsched.storage.sql_queue import SqlQueueStore

    return SqlQueueStore(db)


def acting_user(store: SqlStoreBase) -> Actor:
    """Who runs this command, and whether they are an fsched admin of this job table."""
    from fsched.core.jobs.access import local_actor

    return local_actor(store.file_owner())


def allow(refusal: str | None) -> None:
    """Go on if an access decision (core/jobs/access.py) allowed it; else stop with its reason."""
    if refusal is not None:
        raise UserError(refusal)


def open_catalog_as_admin(db: str | None, doing: str) -> SqlCatalogStore:
    """The catalog, for a command only an fsched admin may run (`doing` names it in the refusal)."""
    from fsched.core.jobs.access import may_administer

    store = open_catalog(db)
    allow(may_administer(acting_user(store), doing))
    return store


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


def iso_time(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
