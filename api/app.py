"""The HTTP application: routes, error shapes, body limits and the progress hub, composed.

FastAPI on uvicorn, the field's convention for OpenAI-compatible servers
(vLLM, SGLang): the OpenAI SDK's expectations (SSE streaming, multipart
uploads, error bodies) are met with the framework's own pieces, and the
handlers stay thin.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from fsched.api import batch, dashboard, errors, expiry, facts, online, responses, tokens
from fsched.api.guard import Guard, StreamRules
from fsched.api.hotpath import HotPath
from fsched.api.hub import ProgressHub
from fsched.api.limits import BodyLimit
from fsched.api.link import LinkClient
from fsched.api.metrics import Metrics
from fsched.api.openapi import openapi_document
from fsched.api.slowclients import BodyDeadline, ClientDeadlines
from fsched.api.state import Backend, ServerState, state_of
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.body import PromptThinking

# Bodies other than uploads are small JSON: an OpenAI request is bounded by a batch line's limit.
JSON_BODY_LIMIT = InputLimits().max_line_bytes
MULTIPART_OVERHEAD = 64 * 1024


def _link_tasks(state: ServerState) -> list[asyncio.Task]:
    """The daemons' links, kept to every live daemon's published address (none when turned off)."""
    if state.link is None:
        return []

    async def addresses() -> set[str]:  # no request waits on it: not asked for (keeps nothing read ahead)
        return {d.stats.link for d in await state.live_daemons(ask=False) if d.stats.link}

    state.hub.on_close = state.link.closed
    return [asyncio.create_task(state.link.run(addresses))]


class ServeApp(FastAPI):
    """FastAPI, with the online POST endpoints answered before its middleware (api/hotpath.py)."""

    hot: HotPath | None = None

    async def __call__(self, scope, receive, send) -> None:
        handler = self.hot.handler_for(scope) if self.hot is not None else None
        if handler is None:
            await super().__call__(scope, receive, send)
        else:
            await self.hot(self, handler, scope, receive, send)


def _bare_app(lifespan) -> ServeApp:
    """FastAPI with its own documents and its OpenTelemetry export off: fsched has none to configure,
    and left on it asks the global providers (environment lookups) on every request, measured at 4% of
    a busy server's CPU."""
    return ServeApp(title="fsched", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                    telemetry={"tracing": False, "metrics": False, "logs": False})


def create_app(backend: Backend, poll_s: float = 0.005, upload_limit: int | None = None,
               tokenizers: tokens.Tokenizers | None = None, metrics_port: int | None = None,
               body_timeout_s: float = ClientDeadlines().body_timeout_s, rules: StreamRules | None = None,
               link: bool = True, tool_parser: str = "auto", thinking: PromptThinking | None = None
               ) -> ServeApp:
    """The server over `backend`; `poll_s`: how often the hub reads open requests' progress;
    `tokenizers` loads the served model's tokenizer for /tokenize (None: the server has none);
    `/metrics` answers only on the listener of `metrics_port` (None: nowhere); `body_timeout_s`
    bounds a body; `rules` bound open streams; `link`: hear the daemons' links (api/link.py); `tool_parser`
    and `thinking`: how answers are read (body.py)."""
    hub = ProgressHub(backend.serving.progress, poll_s, read_states=backend.serving.progress_states)
    state = ServerState(backend=backend, hub=hub, metrics=Metrics(backend),
                        tokenizers=tokenizers or tokens.Tokenizers(), guard=Guard(rules or StreamRules()),
                        link=LinkClient(hub) if link else None, tool_parser=tool_parser, thinking=thinking)
    upload_limit = upload_limit or InputLimits().max_bytes

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.start_submitter()
        tasks = _background_tasks(state)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            state.close()

    app = _bare_app(lifespan)
    app.state.fsched = state
    errors.install(app)
    for module in (online, responses, tokens, batch, dashboard):
        app.include_router(module.router)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        try:
            alive = len(await state_of(request).live_daemons())
        except Exception:  # noqa: BLE001 - the table cannot be read: not healthy
            return JSONResponse({"status": "error", "detail": "the job table cannot be read"}, 503)
        return JSONResponse({"status": "ok", "daemons_alive": alive})

    document = openapi_document(_version())

    @app.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(document)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        body = await state_of(request).call(state.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    _guard_bodies(app, upload_limit, body_timeout_s, metrics_port)
    return app


def _background_tasks(state: ServerState) -> list[asyncio.Task]:
    """What a server runs beside its requests from its start. The limits are read at once: with the group
    commit's connection and statements made ready (`start_submitter`), what a fresh server's first online
    request would otherwise wait for."""
    return [asyncio.create_task(work) for work in (
        state.read_limits_ahead(), state.hub.run(), dashboard.sample_forever(state),
        expiry.expire_forever(state), expiry.reclaim_forever(state),
        facts.keep_fresh_forever(state.refresh_ahead))] + _link_tasks(state)


def _guard_bodies(app: ServeApp, upload_limit: int, body_timeout_s: float, metrics_port: int | None) -> None:
    """Every request's body under its limit and deadline, and the metrics port apart: as middleware,
    and on the online endpoints' own path (api/hotpath.py)."""

    def limit_for(path: str) -> int:
        return upload_limit + MULTIPART_OVERHEAD if path == "/v1/files" else JSON_BODY_LIMIT

    app.add_middleware(BodyLimit, limit_for=limit_for)
    app.add_middleware(BodyDeadline, timeout_s=body_timeout_s)
    app.add_middleware(MetricsListener, port=metrics_port)
    app.hot = HotPath(online.hot_handlers(), JSON_BODY_LIMIT, body_timeout_s, metrics_port)


def _version() -> str:
    try:
        return importlib.metadata.version("fsched")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "0+unknown"


class MetricsListener:
    """ASGI middleware: the metrics port serves `/metrics` alone, and no other port serves it (tenant
    names and per-tenant figures are for the operator's scraper, not for API clients)."""

    def __init__(self, app, port: int | None):
        self.app = app
        self.port = port

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            server = scope.get("server") or (None, None)
            on_metrics_port = self.port is not None and server[1] == self.port
            if on_metrics_port != (scope["path"] == "/metrics"):
                await JSONResponse(errors.error_body(404, "no such endpoint"), 404)(scope, receive, send)
                return
        await self.app(scope, receive, send)
