"""Body size limits, enforced as the bytes arrive (a declared Content-Length over the limit is
refused before a byte is read): 413 in OpenAI's error shape."""

from __future__ import annotations

import json
from collections.abc import Callable

from fsched.api.errors import error_body


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: `limit_for(path)` bytes of request body at most."""

    def __init__(self, app, limit_for: Callable[[str], int]):
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _too_large(send, limit)
            return
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge
            return message

        async def watched_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if not started:
                await _too_large(send, limit)


async def _too_large(send, limit: int) -> None:
    body = json.dumps(error_body(413, f"request body is over the limit of {limit:,} bytes")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
