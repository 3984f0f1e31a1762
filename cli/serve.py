"""`fsched serve`: the OpenAI-compatible HTTP API over the job table (needs the `serve` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import DbOption, UserError, handle_errors, open_table_to_serve

POLL_MS = 5.0
HEADER_TIMEOUT_S = 10.0  # as api/slowclients.py's ClientDeadlines (api/ is imported only once serving)
BODY_TIMEOUT_S = 120.0


def build_backend(db: str | None):
    """The stores a server needs, all over one database connection pool."""
    from fsched.api.state import Backend

    table = open_table_to_serve(db, "serving the HTTP API (fsched serve)")
    return Backend(jobs=table.catalog, keys=table.keys, files=table.files, serving=table.serving)


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
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Serve Prometheus /metrics on this port of 127.0.0.1 "
                                 "(and nowhere else; default: no metrics).")
    ] = None,
    header_timeout: Annotated[
        float, typer.Option("--header-timeout", help="Seconds a client has to send a request's headers.")
    ] = HEADER_TIMEOUT_S,
    body_timeout: Annotated[
        float, typer.Option("--body-timeout", help="Seconds a client has to send a request's whole body.")
    ] = BODY_TIMEOUT_S,
    db: DbOption = None,
) -> None:
    """Serve the OpenAI API (completions, chat, the Batch API) over the job table.

    Each API key (`fsched keys create`) is a tenant. Any number of servers may
    share one job table; the daemons do the generating (`fsched daemon`).
    """
    try:
        import uvicorn

        from fsched.api.app import create_app
        from fsched.api.tokens import Tokenizers
    except ImportError as exc:
        missing = exc.name
        raise UserError(f"fsched serve needs its extra: pip install 'fsched[serve]' ({missing} is missing)") \
            from None
    if not 0.1 <= poll_ms <= 1000:
        raise UserError(f"--poll-ms must be within 0.1..1000, got {poll_ms:g}")
    if metrics_port is not None and metrics_port == port:
        raise UserError("--metrics-port must differ from --port (the API port never serves /metrics)")
    from fsched.api.slowclients import ClientDeadlines, header_deadline_protocol
    from fsched.core.runners.connect import codec_for_served

    try:
        deadlines = ClientDeadlines(header_timeout, body_timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    app = create_app(build_backend(db), poll_s=poll_ms / 1000,
                     tokenizers=Tokenizers(tokenizer, load=codec_for_served), metrics_port=metrics_port,
                     body_timeout_s=deadlines.body_timeout_s)
    protocol = header_deadline_protocol(deadlines.header_timeout_s)
    _run(uvicorn, app, host, port, metrics_port, access_log, protocol)


def _run(uvicorn, app, host: str, port: int, metrics_port: int | None, access_log: bool, protocol) -> None:
    """One uvicorn server on the API's socket and, if asked, the metrics port's (loopback only: the
    scraper runs on this machine, or tunnels in)."""
    # Logs name methods, paths and statuses only: never a prompt or an output.
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log, log_level="info",
                            timeout_graceful_shutdown=5, http=protocol)
    sockets = [config.bind_socket()]
    if metrics_port is not None:
        sockets.append(uvicorn.Config(app, host="127.0.0.1", port=metrics_port).bind_socket())
    uvicorn.Server(config).run(sockets=sockets)
