"""`fsched keys`: API keys of the HTTP server (`fsched serve`), one tenant each; admins only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    handle_errors,
    iso_time,
    open_table_as_admin,
    print_json,
)
from fsched.cli.submit import CLASS_NAMES, parse_class

if TYPE_CHECKING:
    from fsched.core.ports.keys import KeyStore

app = typer.Typer(help="Create, list and revoke API keys of `fsched serve` (admins only).",
                  no_args_is_help=True)


def _admin_key_store(db: str | None, what: str) -> KeyStore:
    return open_table_as_admin(db, what).keys


def key_json(key) -> dict:
    return {"id": key.id, "tenant": key.tenant, "class": key.request_class.value, "name": key.name,
            "admin": key.admin, "created_at": iso_time(key.created_at),
            "revoked_at": iso_time(key.revoked_at)}


@app.command("create")
@handle_errors
def create(
    tenant: Annotated[str, typer.Argument(help="The tenant whose requests the key makes.")],
    request_class: Annotated[
        str, typer.Option("--class", "-c", help=f"Highest class its online requests get: {CLASS_NAMES}.")
    ] = "streaming",
    name: Annotated[str, typer.Option("--name", "-n", help="A label to tell keys apart.")] = "",
    admin: Annotated[
        bool, typer.Option("--admin", help="Also an admin over HTTP: every tenant's work on /dashboard, "
                           "weights.")
    ] = False,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Make a new API key for TENANT and print it once (only its hash is stored)."""
    request_class = parse_class(request_class)
    keys = _admin_key_store(db, "creating an API key")
    key, secret = keys.create_key(tenant, request_class, name, admin=admin)
    if as_json:
        print_json({"key": secret, "id": key.id, "tenant": key.tenant, "class": key.request_class.value,
                    "admin": key.admin})
        return
    print(secret)
    role = ", admin" if key.admin else ""
    typer.echo(f"key {key.id} for tenant {key.tenant}, class {key.request_class.value}{role}; "
               "it is shown only now", err=True)


@app.command("list")
@handle_errors
def list_keys(as_json: JsonOption = False, db: DbOption = None) -> None:
    """List API keys (ids, tenants, classes; never the keys themselves)."""
    keys = _admin_key_store(db, "listing API keys").list_keys()
    if as_json:
        print_json([key_json(k) for k in keys])
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "tenant", "class", "admin", "name", "created", "revoked")
    for k in keys:
        table.add_row(k.id, k.tenant, k.request_class.value, "yes" if k.admin else "", k.name,
                      iso_time(k.created_at), iso_time(k.revoked_at) or "")
    Console().print(table)


@app.command("revoke")
@handle_errors
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (from `fsched keys list`).")],
    db: DbOption = None,
) -> None:
    """Revoke a key: the next request made with it is refused (401)."""
    key = _admin_key_store(db, "revoking an API key").revoke_key(key_id)
    print(f"revoked key {key.id} of tenant {key.tenant}")
