"""`fsched tenants`: list, add, reweight and remove tenants, live."""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    handle_errors,
    open_catalog,
    open_catalog_as_admin,
    print_json,
)

app = typer.Typer(help="List and manage tenants and their weights.", no_args_is_help=True)


@app.command("list")
@handle_errors
def list_tenants(as_json: JsonOption = False, db: DbOption = None) -> None:
    """List tenants: weight, entitled share, active jobs, queued and running requests."""
    from fsched.cli.report import tenant_entitlements, tenant_json

    tenants = open_catalog(db).list_tenants()
    if as_json:
        entitled = tenant_entitlements(tenants)
        print_json([tenant_json(t, entitled[t.name]) for t in tenants])
        return
    from rich.console import Console

    from fsched.cli.views import tenants_table

    Console().print(tenants_table(tenants))


@app.command("add")
@handle_errors
def add(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    weight: Annotated[float, typer.Option("--weight", "-w", help="Weight (> 0).")] = 1.0,
    db: DbOption = None,
) -> None:
    """Add a tenant with a weight (an fsched admin only)."""
    store = open_catalog_as_admin(db, "adding a tenant")
    store.add_tenant(name, weight)
    print(f"added tenant {name} with weight {weight:g}")


@app.command("set-weight")
@handle_errors
def set_weight(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    weight: Annotated[float, typer.Argument(help="New weight (> 0).")],
    db: DbOption = None,
) -> None:
    """Change a tenant's weight (an fsched admin only); a running daemon applies it within a second."""
    store = open_catalog_as_admin(db, "changing a weight")
    store.set_weight(name, weight)
    print(f"tenant {name} now has weight {weight:g}")


@app.command("remove")
@handle_errors
def remove(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    db: DbOption = None,
) -> None:
    """Remove a tenant (an fsched admin only; refused while it has unfinished jobs)."""
    store = open_catalog_as_admin(db, "removing a tenant")
    store.remove_tenant(name)
    print(f"removed tenant {name}")
