"""`fsched serve`: the OpenAI-compatible HTTP API over the job table (needs the `serve` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import DbOption, UserError, handle_errors, open_table_to_serve

POLL_MS = 5.0


def build_backend(db: str | None):
    """The stores a server needs, all over one database connection pool."""
    from fsched.api.state import Backend

    table = open_table_to_serve(db, "serving the HTTP API (fsched serve)")
    return Backend(jobs=table.catalog, keys=table.keys, files=table.files, serving=table.serving)


NoDaemonOption = Annotated[float, typer.Option(
    "--no-daemon-s", help="An open request's stream ends with an error event (and the request is "
    "cancelled) when no daemon has been live this long.")]
StallOption = Annotated[float, typer.Option(
    "--stall-s", help="A streaming client that takes no bytes this long is cut off and its request "
    "cancelled.")]
SendBufferOption = Annotated[int | None, typer.Option(
    "--send-buffer-kb", help="Each connection's kernel send buffer (default: the kernel's, which grows to "
    "megabytes): the most a client that stops reading makes the server hold for it, before --stall-s "
    "counts.")]
LinkOption = Annotated[bool, typer.Option(
    "--link/--no-link", help="Hear the daemons' links (pushed wake-ups and tokens); without, progress is "
    "read from the table only.")]


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
    no_daemon_s: NoDaemonOption = 10.0,
    stall_s: StallOption = 30.0,
    send_buffer_kb: SendBufferOption = None,
    link: LinkOption = True,
    db: DbOption = None,
) -> None:
    """Serve the OpenAI API (completions, chat, the Batch API, /metrics) over the job table.

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
    if send_buffer_kb is not None and not 4 <= send_buffer_kb <= 65536:
        raise UserError(f"--send-buffer-kb must be within 4..65536, got {send_buffer_kb}")
    from fsched.core.runners.connect import codec_for_served

    app = create_app(build_backend(db), poll_s=poll_ms / 1000,
                     tokenizers=Tokenizers(tokenizer, load=codec_for_served),
                     rules=_rules(no_daemon_s, stall_s), link=link)
    # Logs name methods, paths and statuses only: never a prompt or an output.
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log, log_level="info",
                            timeout_graceful_shutdown=5)
    _run(config, app.state.fsched.hub, _listener(host, port, send_buffer_kb) if send_buffer_kb else None)


def _rules(no_daemon_s: float, stall_s: float):
    from fsched.api.guard import StreamRules

    try:
        return StreamRules(no_daemon_s=no_daemon_s, stall_s=stall_s)
    except ValueError as exc:
        raise UserError(f"--no-daemon-s and --stall-s: {exc}") from None


def _listener(host: str, port: int, send_buffer_kb: int):
    """A listening socket whose connections get a fixed send buffer (they inherit it)."""
    import socket

    sock = socket.create_server((host, port), reuse_port=False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_kb * 1024)
    return sock


def _run(config, hub, sock) -> None:
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        """On SIGTERM or SIGINT, open online requests end at once (cancelled, their streams told why),
        so the graceful shutdown has nothing left to wait for."""

        def handle_exit(self, sig, frame) -> None:
            try:
                asyncio.get_running_loop().call_soon_threadsafe(hub.close)
            except RuntimeError:  # no loop running yet: nothing is open
                hub.close()
            super().handle_exit(sig, frame)

    Server(config).run(sockets=[sock] if sock is not None else None)
