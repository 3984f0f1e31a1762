"""`fsched serve`: the OpenAI-compatible HTTP API over the job table (needs the `serve` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    UserError,
    handle_errors,
    known_tool_parser,
    open_table_to_serve,
    quick_thread_handoffs,
    quiet_gc,
)

POLL_MS = 5.0
HEADER_TIMEOUT_S = 10.0  # as api/slowclients.py's ClientDeadlines (api/ is imported only once serving)
BODY_TIMEOUT_S = 120.0
MAX_WORKERS = 64


def open_table_for_serving(db: str | None):
    """The job table a server serves (its stores all over one database connection pool)."""
    return open_table_to_serve(db, "serving the HTTP API (fsched serve)")


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
WorkersOption = Annotated[int, typer.Option(
    "--workers", help="Server processes sharing the port: several event loops read a burst of requests at "
    "once (each costs its own CPU a token). With --metrics-port P, worker i serves its /metrics on P+i.")]
LinkOption = Annotated[bool, typer.Option(
    "--link/--no-link", help="Hear the daemons' links (pushed wake-ups and tokens); without, progress is "
    "read from the table only.")]


ToolParserOption = Annotated[
    str, typer.Option("--tool-call-parser", help="The model family whose syntax tool calls are read in: "
                      "auto (the --tokenizer folder's own response template where its tokenizer "
                      "carries one, else the family its chat template shows, else any known one), "
                      "hermes, llama3_json or mistral (docs/models.md).")
]


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
    tool_call_parser: ToolParserOption = "auto",
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
    no_daemon_s: NoDaemonOption = 10.0,
    stall_s: StallOption = 30.0,
    send_buffer_kb: SendBufferOption = None,
    link: LinkOption = True,
    workers: WorkersOption = 1,
    db: DbOption = None,
) -> None:
    """Serve the OpenAI API (completions, chat, the Batch API) over the job table.

    Each API key (`fsched keys create`) is a tenant. Any number of servers may
    share one job table; the daemons do the generating (`fsched daemon`).
    """
    uvicorn = _serving_extra()
    _check(poll_ms, port, metrics_port, send_buffer_kb, workers)
    from fsched.api.app import create_app
    from fsched.api.slowclients import header_deadline_protocol
    from fsched.api.tokens import Tokenizers
    from fsched.core.runners.connect import codec_for_served

    deadlines = _deadlines(header_timeout, body_timeout)
    rules, parser, thinking = _rules(no_daemon_s, stall_s), _tool_parser(tool_call_parser, tokenizer), \
        _thinking(tokenizer)

    def app_for(backend, metrics_at: int | None):
        return create_app(backend, poll_s=poll_ms / 1000, metrics_port=metrics_at,
                          tokenizers=Tokenizers(tokenizer, load=codec_for_served),
                          body_timeout_s=deadlines.body_timeout_s, rules=rules, link=link, tool_parser=parser,
                          thinking=thinking)

    protocol = header_deadline_protocol(deadlines.header_timeout_s)
    # Logs name methods, paths and statuses only: never a prompt or an output.
    config = uvicorn.Config(None, host=host, port=port, access_log=access_log, log_level="info",
                            timeout_graceful_shutdown=5, http=protocol)
    _serve_on(uvicorn, config, db, app_for, metrics_port, workers, send_buffer_kb)


def _serving_extra():
    """uvicorn, once the serve extra is known to be installed."""
    try:
        import uvicorn

        import fsched.api.app  # noqa: F401 - its imports are the extra's
    except ImportError as exc:
        missing = exc.name
        raise UserError(f"fsched serve needs its extra: pip install 'fsched[serve]' ({missing} is missing)") \
            from None
    return uvicorn


def _deadlines(header_timeout: float, body_timeout: float):
    from fsched.api.slowclients import ClientDeadlines

    try:
        return ClientDeadlines(header_timeout, body_timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _serve_on(uvicorn, config, db: str | None, app_for, metrics_port: int | None, workers: int,
              send_buffer_kb: int | None) -> None:
    """The sockets bound, then one server in this process, or `workers` of them in worker processes
    (api/workers.py), each with its own connections to the table."""
    from fsched.api.state import Backend
    from fsched.storage.db import MEMORY_SCHEME

    table = open_table_for_serving(db)  # checked (and its errors said) once, before any worker starts
    if workers > 1 and table.display_url.startswith(MEMORY_SCHEME):
        raise UserError("--workers: an in-memory table lives in one process; serve a database's table")
    listening = _bind(uvicorn, config, metrics_port, workers, send_buffer_kb)
    if workers == 1:
        _run(uvicorn, app_for(Backend.of(table), metrics_port), config, listening[0])
        return
    table.dispose()  # none of its connections may cross a fork

    def work(index: int, ready) -> None:
        for other, sockets in enumerate(listening):
            if other != index:
                for sock in sockets[1:]:  # the other workers' metrics ports
                    sock.close()
        at = None if metrics_port is None else metrics_port + index
        _run(uvicorn, app_for(Backend.of(open_table_for_serving(db)), at), config, listening[index], ready)

    _supervise(workers, work, config.host, config.port)


def _tool_parser(name: str, tokenizer: str | None = None) -> str:
    """The family named, or under `auto` the --tokenizer folder's own response template where its
    tokenizer carries one, else the family its chat template shows (else any)."""
    from fsched.core.openai.toolcalls import template
    from fsched.core.openai.toolcalls.families import AUTO, family_of_template
    from fsched.core.runners.templates import folder_chat_templates, folder_response_template

    if known_tool_parser(name) != AUTO or tokenizer is None:
        return name
    spec = folder_response_template(tokenizer)
    if spec is not None:
        from fsched.core.runners.hf.response_template import template_events

        try:
            registered = template.register(spec, template_events(spec, template.REASONING))
        except (ValueError, TypeError) as exc:
            raise UserError(f"--tokenizer: its response_template: {exc}") from None
        typer.echo(f"fsched serve: answers are read by the response template of {tokenizer}", err=True)
        return registered
    family = family_of_template(folder_chat_templates(tokenizer))
    if family is None:
        return AUTO
    typer.echo(f"fsched serve: tool calls are read as {family}'s (the chat template of {tokenizer})",
               err=True)
    return family


def _thinking(tokenizer: str | None):
    """Whether a chat's prompt, rendered by the --tokenizer folder's chat template, leaves a reasoning
    block open (its answer then starts inside its reasoning); None when the template never writes
    `<think>` (nothing is rendered then)."""
    from fsched.core.openai.toolcalls.reading import THINK_OPEN, prompt_opens_reasoning
    from fsched.core.runners.templates import folder_chat_templates

    if tokenizer is None or not any(THINK_OPEN in t for t in folder_chat_templates(tokenizer)):
        return None
    from fsched.core.runners.hf.model import ModelLoadError
    from fsched.core.runners.hf.tokenizer import chat_renderer

    try:
        rendered = chat_renderer(tokenizer)
    except ModelLoadError as exc:
        raise UserError(f"--tokenizer: {exc}") from None
    return lambda messages, render: prompt_opens_reasoning(rendered(messages, render))


def _check(poll_ms: float, port: int, metrics_port: int | None, send_buffer_kb: int | None,
           workers: int = 1) -> None:
    if not 0.1 <= poll_ms <= 1000:
        raise UserError(f"--poll-ms must be within 0.1..1000, got {poll_ms:g}")
    if not 1 <= workers <= MAX_WORKERS:
        raise UserError(f"--workers must be within 1..{MAX_WORKERS}, got {workers}")
    if metrics_port is not None and metrics_port <= port < metrics_port + workers:
        raise UserError("--metrics-port must differ from --port (the API port never serves /metrics)"
                        + (f"; with --workers {workers}, ports {metrics_port}..{metrics_port + workers - 1} "
                           "serve the workers' /metrics" if workers > 1 else ""))
    if metrics_port is not None and metrics_port + workers - 1 > 65535:
        raise UserError(f"--metrics-port {metrics_port}: with --workers {workers} the last worker's would be "
                        f"{metrics_port + workers - 1}, past 65535")
    if send_buffer_kb is not None and not 4 <= send_buffer_kb <= 65536:
        raise UserError(f"--send-buffer-kb must be within 4..65536, got {send_buffer_kb}")


def _rules(no_daemon_s: float, stall_s: float):
    from fsched.api.guard import StreamRules

    try:
        return StreamRules(no_daemon_s=no_daemon_s, stall_s=stall_s)
    except ValueError as exc:
        raise UserError(f"--no-daemon-s and --stall-s: {exc}") from None


def _bind(uvicorn, config, metrics_port: int | None, workers: int, send_buffer_kb: int | None
          ) -> list[list]:
    """The listening sockets, bound before any worker starts: per worker, the API's (one socket, shared
    by every worker) then its own metrics port's (loopback only: the scraper runs on this machine, or
    tunnels in), if asked."""
    import socket

    api = config.bind_socket()
    if send_buffer_kb is not None:  # connections inherit it: the most a stalled client makes us hold
        api.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_kb * 1024)
    listening = []
    for index in range(workers):
        sockets = [api]
        if metrics_port is not None:
            # log_config=None: a second logging setup would undo --no-access-log
            metrics = uvicorn.Config(None, host="127.0.0.1", port=metrics_port + index, log_config=None)
            sockets.append(metrics.bind_socket())
        listening.append(sockets)
    return listening


def _run(uvicorn, app, config, sockets: list, ready=None) -> None:
    """One uvicorn server on these sockets (`ready()` once it accepts connections). On SIGTERM or
    SIGINT, open online requests end at once (cancelled, their streams told why), so the graceful
    shutdown has nothing left to wait for."""
    import asyncio

    hub = app.state.fsched.hub

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            try:
                asyncio.get_running_loop().call_soon_threadsafe(hub.close)
            except RuntimeError:  # no loop running yet: nothing is open
                hub.close()
            super().handle_exit(sig, frame)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and ready is not None:
                ready()

    config.app = app
    _log_fsched_lines()
    quiet_gc()
    quick_thread_handoffs()
    Server(config).run(sockets=sockets)


def _supervise(workers: int, work, host: str, port: int) -> None:
    """Run the workers until stopped; a worker that could not start ends the command with its status."""
    import os

    from fsched.api.workers import Supervisor

    def say(line: str) -> None:
        typer.echo(f"fsched serve: {line}", err=True)

    say(f"{workers} workers on http://{host}:{port} (supervisor pid {os.getpid()})")
    status = Supervisor(workers, work, say).run()
    if status:
        raise typer.Exit(status)


def _log_fsched_lines() -> None:
    """fsched's own log lines (a client gone, a link lost) on stderr at INFO, in uvicorn's form."""
    import logging
    import sys

    from uvicorn.logging import DefaultFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False))
    logger = logging.getLogger("fsched")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
