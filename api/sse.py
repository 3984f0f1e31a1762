"""Server-sent events with a bound on a client that stops reading.

A stream is written as fast as the client takes it: when its socket's
buffers are full, the write waits (backpressure: nothing piles up in the
server beyond the transport's buffer). A write that waits longer than
`stall_s` ends the response: the connection is closed, and the stream's own
`finally` cancels its request.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi.responses import StreamingResponse
from starlette.types import Send

from fsched.core.jobs.jsontext import dumps as json_text

log = logging.getLogger("fsched.serve")

KEEPALIVE = ": keep-alive\n\n"


def sse(obj: dict) -> str:
    return f"data: {json_text(obj, separators=(',', ':'))}\n\n"


class ClientStalled(Exception):
    """The client took no bytes for the stated bound."""


class BoundedStream(StreamingResponse):
    def __init__(self, content, stall_s: float, **kwargs):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                         **kwargs)
        self.stall_s = stall_s

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                body = chunk.encode(self.charset) if isinstance(chunk, str) else chunk
                try:
                    await asyncio.wait_for(send({"type": "http.response.body", "body": body,
                                                 "more_body": True}), self.stall_s)
                except TimeoutError:
                    log.warning("a client took no bytes for %g s: its stream is closed", self.stall_s)
                    raise ClientStalled from None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.body_iterator.aclose()  # its `finally` cancels an unfinished request
