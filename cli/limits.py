"""`fsched limits`: the limits that protect the job table, stored in it and set by an admin.

`fsched submit`, `fsched generate` and `fsched serve` all obey them; a user's
environment (FSCHED_MAX_LINES=...) may lower one for a command, never raise it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import DbOption, JsonOption, handle_errors, open_table, open_table_as_admin, print_json

app = typer.Typer(help="Show and set the limits on what clients may submit (setting: admins only).",
                  no_args_is_help=True)


@app.command("show")
@handle_errors
def show(as_json: JsonOption = False, db: DbOption = None) -> None:
    """Each limit, its value, and whether an admin set it."""
    from dataclasses import asdict

    from fsched.core.jobs.limits import limits_in_force

    stored = open_table(db).keys.stored_limits()
    values = asdict(limits_in_force(stored))
    rows = [{"name": k, "value": v, "set": k in stored} for k, v in values.items()]
    if as_json:
        print_json(rows)
        return
    for row in rows:
        print(f"{row['name']:<24} {row['value']:>14,}  {'(set)' if row['set'] else '(default)'}")


@app.command("set")
@handle_errors
def set_limit(
    name: Annotated[str, typer.Argument(help="Limit name (see `fsched limits show`).")],
    value: Annotated[int, typer.Argument(help="New value (>= 1).")],
    db: DbOption = None,
) -> None:
    """Store a limit (an fsched admin only); it applies to the next submit or request."""
    from fsched.core.jobs.limits import validate_limit

    open_table_as_admin(db, "setting a limit").keys.set_limit(name, validate_limit(name, value))
    print(f"limit {name} is now {value:,}")


@app.command("unset")
@handle_errors
def unset(
    name: Annotated[str, typer.Argument(help="Limit name.")],
    db: DbOption = None,
) -> None:
    """Put a limit back to its default (an fsched admin only)."""
    from fsched.core.jobs.limits import LIMIT_NAMES

    if name not in LIMIT_NAMES:
        raise ValueError(f"unknown limit {name!r}; the limits are {', '.join(LIMIT_NAMES)}")
    open_table_as_admin(db, "setting a limit").keys.set_limit(name, None)
    print(f"limit {name} is back to its default")
