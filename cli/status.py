"""`fsched status`: jobs, tenants and daemons, once, as JSON, or live."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    acting_user,
    allow,
    handle_errors,
    open_catalog,
    print_json,
)

RECENT_FINISHED_JOBS = 10


@handle_errors
def status(
    job_id: Annotated[int | None, typer.Argument(help="Show this job only.")] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's jobs (not an admin: only yours).")
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all", "-a", help=f"All finished jobs too (default: the last {RECENT_FINISHED_JOBS})."
        ),
    ] = False,
    as_json: JsonOption = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Redraw live until Ctrl-C.")] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column, however wide the terminal (default: fit it).")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between redraws.")] = 1.0,
    db: DbOption = None,
) -> None:
    """Show jobs (progress, tokens, age), tenants (weight, entitled share) and daemons.

    A user who is not an fsched admin sees their own jobs; other tenants only
    as totals in the tenants table.
    """
    from fsched.cli.report import StatusSnapshot, status_json
    from fsched.core.jobs.access import may_touch_job, visible_tenant

    store = open_catalog(db)
    actor = acting_user(store)
    tenant, refusal = visible_tenant(actor, tenant)
    allow(refusal)
    if job_id is not None:
        (job,) = store.list_jobs(job_id=job_id)
        allow(may_touch_job(actor, "see", job_id, job.tenant))

    def snapshot() -> StatusSnapshot:
        # Online requests (and `generate` prompts) are one-request jobs: listed grouped per tenant
        # and key, so the files and batches a user follows are not buried under them.
        return StatusSnapshot(
            jobs=store.list_jobs(
                job_id=job_id,
                tenant=tenant,
                finished_limit=None if show_all else RECENT_FINISHED_JOBS,
                interactive=None if job_id is not None else False,
            ),
            tenants=store.list_tenants(),
            daemons=store.list_daemons(),
            now=time.time(),
            online=store.online_groups(tenant=tenant) if job_id is None else [],
        )

    if as_json:
        print_json(status_json(snapshot()))
        return
    _show(snapshot, watch, wide, interval)


def _show(snapshot, watch: bool, wide: bool, interval: float) -> None:
    """Print the view once, fitted to the terminal (or as wide as it is with `wide`), or live."""
    from rich.console import Console

    from fsched.cli.views import status_parts, status_view, within_height

    console = Console()
    if not watch:
        view = status_view(snapshot(), console.width, wide)
        if wide:
            console = Console(width=max(console.width, console.measure(view).maximum))
        console.print(view)
        return
    _watch(console, lambda: within_height(status_parts(snapshot(), console.width, wide), console,
                                          console.height), max(interval, 0.1))


def _watch(console, render, interval: float) -> None:
    import signal
    import threading

    from rich.live import Live

    # One Live region redrawn in place (no clearing between frames), so the
    # view does not flicker; each frame is fitted to the terminal as it is then.
    # Ctrl-C ends it quietly, between two redraws: a KeyboardInterrupt raised
    # inside a query could leave the connection pool's lock held and hang the exit.
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        with Live(render(), console=console, auto_refresh=False, screen=False) as live:
            while not stop.wait(interval):
                live.update(render(), refresh=True)
    finally:
        signal.signal(signal.SIGINT, previous)
