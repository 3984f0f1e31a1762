"""The online POST endpoints answered before FastAPI's middleware and routing: the same answers, less CPU.

Every chat and completions request went through a dozen ASGI layers
(Starlette's error and exception middleware, FastAPI's body limit, its exit
stacks, the router, the included router, the route, the endpoint's
dependency solving) and through serve's own body limit and deadline, each
wrapping every `receive` and `send`: measured with py-spy at 512 streams of
8-token requests, those layers were a seventh of serve's CPU. These
endpoints take no dependencies and parse their bodies themselves, so here a
request to one of them is matched on its method and exact path, its body
read under the same size limit and deadline as api/limits.py's and
api/slowclients.py's middleware enforce, and its handler's answer or
exception turned into the response api/errors.py's handlers would give.
Anything else (another method, a path with a slash more, the metrics port)
goes through the FastAPI app as before, whose routes for these paths stay
(405s name their methods from them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from fsched.api.errors import ApiError, error_response, send_refusal, storage_unavailable, unexpected_error
from fsched.api.limits import BodyTooLarge
from fsched.api.slowclients import BodyTooSlow
from fsched.core.ports.records import StorageError
from fsched.core.stamps import ARRIVED
from fsched.core.stamps import enabled as stamps_on

# A handler of a hot endpoint: the request (its headers, its app, its receive for the disconnect) and
# its whole body -> the response.
Handler = Callable[[Request, bytes], Awaitable[Response]]


class HotPath:
    """The hot endpoints' handlers by path, with the body rules every request to them is held to."""

    def __init__(self, handlers: dict[str, Handler], body_limit: int, body_timeout_s: float,
                 metrics_port: int | None):
        self.handlers = handlers
        self.body_limit = body_limit
        self.body_timeout_s = body_timeout_s
        self.metrics_port = metrics_port

    def handler_for(self, scope) -> Handler | None:
        """The handler of a POST to one of the paths on the API port, else None (FastAPI answers)."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        handler = self.handlers.get(scope["path"])
        if handler is None or self.metrics_port is not None and (scope.get("server") or (None, None))[1] \
                == self.metrics_port:
            return None
        return handler

    async def __call__(self, app, handler: Handler, scope, receive, send) -> None:
        scope["app"] = app
        if stamps_on():
            scope[ARRIVED] = time.time()
        try:
            body = await self._body(scope, receive)
        except (BodyTooLarge, BodyTooSlow) as refused:
            await send_refusal(send, refused.status, refused.message)
            return
        if body is None:  # the client went away before its body was in: nobody to answer
            return
        await _answered(handler, Request(scope, receive, send), body, scope, receive, send)

    async def _body(self, scope, receive) -> bytes | None:
        """The request's whole body (None if the client hung up first), over the limit refused as soon as
        it says or shows it is, and refused when it is not in within the body deadline."""
        limit = self.body_limit
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise BodyTooLarge(limit)
        pieces, size = [], 0
        deadline = time.monotonic() + self.body_timeout_s
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):  # a timer, no task
                    message = await receive()
            except TimeoutError:
                raise BodyTooSlow(self.body_timeout_s) from None
            if message["type"] != "http.request":
                return None
            piece = message.get("body", b"")
            size += len(piece)
            if size > limit:
                raise BodyTooLarge(limit)
            pieces.append(piece)
            if not message.get("more_body", False):
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def _answered(handler: Handler, request: Request, body: bytes, scope, receive, send) -> None:
    """The handler's response sent; an exception answered as api/errors.py's handlers answer it (an
    unexpected one also raised again, as Starlette's error middleware does, for the server's log)."""
    started = False

    async def watched_send(message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        response = await handler(request, body)
        await response(scope, receive, watched_send)
    except ApiError as exc:
        if started:
            raise
        await error_response(exc)(scope, receive, send)
    except StorageError:
        if started:
            raise
        await storage_unavailable()(scope, receive, send)
    except Exception:
        if not started:
            await unexpected_error()(scope, receive, send)
        raise
