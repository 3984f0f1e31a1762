"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the status
codes the OpenAI SDK maps to its exception classes."""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from fsched.core.ports.records import StorageError

# OpenAI's error type for each status fsched answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error")
    return {"error": {"message": _encodable(message), "type": kind,
                      "param": None if param is None else _encodable(param), "code": code}}


def _encodable(text: str) -> str:
    """`text` as UTF-8 can carry it: a lone surrogate the client sent is shown as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code), exc.status, exc.headers)


def storage_unavailable() -> JSONResponse:
    """The table is locked past its timeout, full or gone: the client may retry."""
    body = error_body(503, "the job table is unavailable; retry shortly", code="storage")
    return JSONResponse(body, 503, {"Retry-After": "1"})


def unexpected_error() -> JSONResponse:
    return JSONResponse(error_body(500, "internal error"), 500)


def not_found(what: str, object_id: str, param: str | None = None) -> ApiError:
    """Unknown and another tenant's objects read the same: nothing tells that the id exists."""
    return ApiError(404, f"no {what} with id {object_id!r}", param, "not_found")


def _methods_of(app: FastAPI, path: str) -> set[str]:
    probe = {"type": "http", "path": path, "method": "", "root_path": ""}
    routes, found = list(app.router.routes), set()
    while routes:
        route = routes.pop()
        if hasattr(route, "original_router"):  # an included router: its own routes
            routes.extend(route.original_router.routes)
        elif getattr(route, "methods", None) and route.matches(probe)[0] is not Match.NONE:
            found |= route.methods
    return found


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # every method of the path, not only the first route's (RFC 9110)
            allowed = _methods_of(_request.app, _request.url.path)
            headers = {**(headers or {}), "Allow": ", ".join(sorted(allowed))}
        return JSONResponse(error_body(exc.status_code, message), exc.status_code, headers)

    @app.exception_handler(StorageError)
    async def storage_error(_request: Request, _exc: StorageError) -> JSONResponse:
        return storage_unavailable()

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, _exc: Exception) -> JSONResponse:
        return unexpected_error()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(error_body(400, first.get("msg", "invalid request"), param), 400)


class BodyRefused(Exception):
    """Raised from an ASGI middleware's receive(): the request is answered `status` with `message`
    (unless its response has already started), and the connection closes."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


async def send_refusal(send, status: int, message: str) -> None:
    """A whole error answer at the ASGI level, before any route ran, closing the connection."""
    body = json.dumps(error_body(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def run_refusing(app, scope, receive, send) -> None:
    """Run `app` with a wrapped `receive` that may raise BodyRefused: answer the refusal if nothing
    was sent yet (once a response started, the connection can only be dropped)."""
    started = False

    async def watched_send(message):
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, watched_send)
    except BodyRefused as refused:
        if not started:
            await send_refusal(send, refused.status, refused.message)
