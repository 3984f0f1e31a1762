"""`fsched limits`: the limits that protect the job table, stored in it and set by an admin.

`fsched submit`, `fsched generate` and `fsched serve` all obey the input
limits; a user's environment (FSCHED_MAX_LINES=...) may lower one for a
command, never raise it. The rate limits (requests and tokens a minute, per
API key) are what `fsched serve` enforces; unset, a key is unlimited. Set
table-wide they apply to every key; `--key ID` sets one key's own.
"""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import DbOption, JsonOption, handle_errors, open_table, open_table_as_admin, print_json

SOURCES = {"default": "default", "table": "set", "key": "set on this key"}
app = typer.Typer(help="Show and set the limits on what clients may submit (setting: admins only).",
                  no_args_is_help=True)
KeyOption = Annotated[str | None, typer.Option(
    "--key", help="An API key's id (`fsched keys list`): that key's own rate limit, over the table's.")]


@app.command("show")
@handle_errors
def show(key: KeyOption = None, as_json: JsonOption = False, db: DbOption = None) -> None:
    """Each limit, its value, and whether an admin set it (with --key: that key's rate limits)."""
    from fsched.core.jobs.limits import limit_rows

    keys = open_table(db).keys
    rows = limit_rows(keys.stored_limits(), None if key is None else _key_limits(keys, key))
    if as_json:
        print_json(rows)
        return
    for row in rows:
        value = "unlimited" if row["value"] is None else f"{row['value']:,}"
        print(f"{row['name']:<26} {value:>16}  ({SOURCES[row['from']]})")


def _key_limits(keys, key_id: str) -> dict[str, int]:
    from fsched.core.ports.records import UnknownKey

    if keys.get_key(key_id) is None:
        raise UnknownKey(key_id)
    return keys.key_limits(key_id)


@app.command("set")
@handle_errors
def set_limit(
    name: Annotated[str, typer.Argument(help="Limit name (see `fsched limits show`).")],
    value: Annotated[int, typer.Argument(help="New value (>= 1).")],
    key: KeyOption = None,
    db: DbOption = None,
) -> None:
    """Store a limit (an fsched admin only); it applies to the next submit or request (within 1 s)."""
    from fsched.core.jobs.limits import validate_limit

    validate_limit(name, value, per_key=key is not None)
    keys = open_table_as_admin(db, "setting a limit").keys
    if key is None:
        keys.set_limit(name, value)
        print(f"limit {name} is now {value:,}")
    else:
        keys.set_key_limit(key, name, value)
        print(f"limit {name} of key {key} is now {value:,}")


@app.command("unset")
@handle_errors
def unset(
    name: Annotated[str, typer.Argument(help="Limit name.")],
    key: KeyOption = None,
    db: DbOption = None,
) -> None:
    """Put a limit back to its default, or a key's back to the table-wide one (an fsched admin only)."""
    from fsched.core.jobs.limits import validate_limit_name

    validate_limit_name(name, per_key=key is not None)
    keys = open_table_as_admin(db, "setting a limit").keys
    if key is None:
        keys.set_limit(name, None)
        print(f"limit {name} is back to its default")
    else:
        keys.set_key_limit(key, name, None)
        print(f"limit {name} of key {key} is back to the table-wide one")
