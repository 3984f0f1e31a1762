"""Request bodies: their size limits, enforced as the bytes arrive (a declared Content-Length over
the limit is refused before a byte is read: 413 in OpenAI's error shape), and their text."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request

from fsched.api.errors import ApiError, BodyRefused, run_refusing, send_refusal


async def body_text(request: Request) -> str:
    """The request's body as text; a 400 when it is not UTF-8."""
    return text_of(await request.body())


def text_of(body: bytes) -> str:
    """A body as text; a 400 when it is not UTF-8."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8") from None


class BodyTooLarge(BodyRefused):
    def __init__(self, limit: int):
        super().__init__(413, f"request body is over the limit of {limit:,} bytes")


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
            refused = BodyTooLarge(limit)
            await send_refusal(send, refused.status, refused.message)
            return
        seen = 0

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await run_refusing(self.app, scope, counted_receive, send)
