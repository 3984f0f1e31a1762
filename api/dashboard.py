"""`/dashboard`: one live page of the scheduler for admins and tenants.

The page is static (HTML, its script and the vendored uPlot, all served from
the package: it works offline, with no CDN). It asks for an API key, keeps it
in the tab's sessionStorage and sends it as `Authorization: Bearer` on every
read (never in a URL: server-sent events cannot carry that header, so the page
polls `GET /dashboard/api/state` every second). What a key sees is decided in
`dashboard_view`. An admin key may change a tenant's weight
(`POST /dashboard/api/weights`), through the rule `fsched tenants set-weight`
applies: only an admin, and the weight validated by the store.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fsched.api.dashboard_view import Facts, state_json
from fsched.api.errors import ApiError
from fsched.api.history import TTFT_WINDOW_S, History
from fsched.api.state import ServerState, state_of
from fsched.core.jobs.access import Actor, may_administer
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.ports.records import StoreError, UnknownTenant, newest_live_daemon

router = APIRouter()
# The finished jobs a page lists besides the unfinished ones, newest first.
FINISHED_JOBS_SHOWN = 20
ASSETS = {
    "dashboard.js": ("fsched.api", "static", "text/javascript"),
    "dashboard.css": ("fsched.api", "static", "text/css"),
    "uPlot.iife.min.js": ("fsched.core", "data/web", "text/javascript"),
    "uPlot.min.css": ("fsched.core", "data/web", "text/css"),
    "uPlot.LICENSE": ("fsched.core", "data/web", "text/plain"),
}
# The page loads only its own files and talks only to its own server.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _asset(package: str, folder: str, name: str) -> bytes:
    return resources.files(package).joinpath(folder, name).read_bytes()


@router.get("/dashboard")
async def page() -> Response:
    body = _asset("fsched.api", "static", "dashboard.html")
    return Response(body, media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/dashboard/assets/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise ApiError(404, f"no dashboard asset {name!r}", code="not_found")
    package, folder, media = ASSETS[name]
    return Response(_asset(package, folder, name), media_type=f"{media}; charset=utf-8", headers=HEADERS)


@router.get("/dashboard/api/state")
async def state(request: Request, since: float | None = None) -> JSONResponse:
    server = state_of(request)
    viewer = await server.authenticate(request)
    history = history_of(server)
    facts = await server.call(gather, server, viewer)
    history.viewed(facts.now)
    if history.wanted(facts.now):
        history.add(facts)
    body = state_json(facts, viewer, list(history.samples), since)
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


@router.post("/dashboard/api/weights")
async def set_weight(request: Request) -> JSONResponse:
    server = state_of(request)
    viewer = await server.authenticate(request)
    if may_administer(key_actor(viewer), "changing a weight") is not None:
        raise ApiError(403, "changing a weight needs an admin key (fsched keys create TENANT --admin)",
                       code="not_admin")
    body = await _json_body(request)
    tenant, weight = body.get("tenant"), body.get("weight")
    if not isinstance(tenant, str):
        raise ApiError(400, "'tenant' must be a tenant's name", "tenant", "invalid_value")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ApiError(400, "'weight' must be a number > 0", "weight", "invalid_value")
    try:
        await server.call(server.backend.jobs.set_weight, tenant, float(weight))
    except UnknownTenant as exc:
        raise ApiError(404, str(exc), "tenant", "not_found") from None
    except (ValueError, StoreError) as exc:
        raise ApiError(400, str(exc), "weight", "invalid_value") from None
    return JSONResponse({"tenant": tenant, "weight": float(weight)})


async def _json_body(request: Request) -> dict:
    import json

    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def key_actor(key: ApiKey) -> Actor:
    """An API key as the actor the access rules decide for: an admin key is an admin."""
    return Actor(user=key.tenant, admin=key.admin, why_admin="admin API key" if key.admin else None)


def history_of(server: ServerState) -> History:
    if server.history is None:
        server.history = History()
    return server.history


def gather(server: ServerState, viewer: ApiKey | None) -> Facts:
    """One read of every figure (in a worker thread); with a viewer, also the jobs and online
    groups it may see."""
    jobs = server.backend.jobs
    now = time.time()
    daemons = jobs.list_daemons()
    live = [d for d in daemons if d.alive(now)]
    newest = newest_live_daemon(daemons, now)
    facts = dict(
        now=now, jobs=jobs.list_jobs(include_finished=False), tenants=jobs.list_tenants(), daemons=daemons,
        live=live, totals=server.backend.serving.tenant_totals(),
        first_tokens=server.backend.serving.first_tokens(now - TTFT_WINDOW_S),
        served=dict(newest.stats.served_share) if newest else {},
    )
    if viewer is not None:
        mine = None if viewer.admin else viewer.tenant
        facts["listed"] = jobs.list_jobs(tenant=mine, finished_limit=FINISHED_JOBS_SHOWN, interactive=False)
        facts["online"] = jobs.online_groups(tenant=mine)
    return Facts(**facts)


async def sample_forever(server: ServerState) -> None:
    """Sample the charts' figures while someone watches (the server's background task)."""
    history = history_of(server)
    while True:
        await asyncio.sleep(history.sample_s)
        if history.wanted(time.time()):
            try:
                history.add(await server.call(gather, server, None))
            except Exception:  # noqa: BLE001 - the table cannot be read now: try again next time
                continue
