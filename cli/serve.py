"""`fsched serve`: the OpenAI-compatible HTTP API over the job table (needs the `serve` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import DbOption, UserError, acting_user, allow, handle_errors, open_catalog

POLL_MS = 5.0


def build_backend(db: str | None):
    """The stores a server needs, all over one database connection pool."""
    from fsched.api.state import Backend
    from fsched.cli.report import daemon_alive
    from fsched.storage.sql_files import SqlFileStore
    from fsched.storage.sql_keys import SqlKeyStore
    from fsched.storage.sql_serving import SqlServingStore

    jobs = open_catalog(db)
    if jobs.db.dialect == "sqlite":
        # The server reads every tenant's requests and keys: on a shared SQLite table that is an
        # admin's job, as the daemon is. (On PostgreSQL, the URL's credentials let a server in.)
        from fsched.core.jobs.access import may_administer

        allow(may_administer(acting_user(jobs), "serving the HTTP API (fsched serve)"))
    return Backend(jobs=jobs, keys=SqlKeyStore(jobs.db), files=SqlFileStore(jobs.db),
                   serving=SqlServingStore(jobs.db), daemon_alive=daemon_alive)


@handle_errors
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind (put TLS in front; see docs/http.md).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    poll_ms: Annotated[
        float, typer.Option("--poll-ms", help="How often open requests' progress is read from the table.")
    ] = POLL_MS,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log each request's method, path, status.")
    ] = True,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="The served model's folder, for /tokenize and token "
                                 "ids in answers (default: known from the daemons' model when it is the "
                                 "tiny model or the stand-in).")
    ] = None,
    db: DbOption = None,
) -> None:
    """Serve the OpenAI API (completions, chat, the Batch API, /metrics) over the job table.

    Each API key (`fsched keys create`) is a tenant. Any number of servers may
    share one job table; the daemons do the generating (`fsched daemon`).
    """
    try:
        import uvicorn

        from fsched.api.app import create_app
    except ImportError as exc:
        missing = exc.name
        raise UserError(f"fsched serve needs its extra: pip install 'fsched[serve]' ({missing} is missing)") \
            from None
    if not 0.1 <= poll_ms <= 1000:
        raise UserError(f"--poll-ms must be within 0.1..1000, got {poll_ms:g}")
    app = create_app(build_backend(db), poll_s=poll_ms / 1000, tokenizer=tokenizer)
    # Logs name methods, paths and statuses only: never a prompt or an output.
    uvicorn.run(app, host=host, port=port, access_log=access_log, log_level="info",
                timeout_graceful_shutdown=5)
