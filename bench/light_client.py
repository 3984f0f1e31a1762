"""A light streamed-chat client for load generation: raw asyncio protocols on keep-alive connections, the
request's bytes built once, no SDK and no JSON decoded but the usage chunk. One such process streams
tens of thousands of tokens a second where the `openai` SDK spends 220-265 µs of CPU a chunk, so at
high stream counts the load measures the server, not the client (bench/online_capacity.py,
bench/online_path.py --client light)."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

from tests.support.ideal_client import ChunkedEvents

MESSAGES = [{"role": "user", "content": "tell me about fair scheduling"}]


def chat_request(url: str, key: str, model: str, tokens: int, headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one streamed chat request (greedy, ignore_eos, include_usage) to `url`'s server."""
    body = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True}).encode()
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in (headers or {}).items())
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nAccept: text/event-stream\r\n%sContent-Length: %d\r\n\r\n%s"
            % (urlsplit(url).netloc.encode(), key.encode(), extra, len(body), body))


class LightStream(ChunkedEvents):
    """One keep-alive connection: a request at a time, its chunked SSE answer read from bytes. `start`'s
    future gives (completion tokens by the usage chunk, seconds to the first content or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.done: asyncio.Future | None = None
        self.sent_at = 0.0
        self.first: float | None = None
        self.usage = 0
        self.transport = None
        self.closed = False  # the server closed it (an idle keep-alive connection past its timeout)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def start(self, request: bytes) -> asyncio.Future:
        self.buf, self.head, self.first, self.usage = b"", False, None, 0
        self.done = asyncio.get_running_loop().create_future()
        self.sent_at = time.perf_counter()
        if self.closed:
            self._fail(ConnectionError("the connection was closed before the request"))
        else:
            self.transport.write(request)
        return self.done

    def _ended(self) -> None:
        if not self.done.done():
            self.done.set_result((self.usage, self.first))

    def _events(self, payload: bytes) -> None:
        for line in payload.split(b"\n"):
            if self.first is None and b'"content":"' in line and b'"content":""' not in line:
                self.first = time.perf_counter() - self.sent_at
            elif line.startswith(b"data: {") and b'"usage":{' in line:
                self.usage = json.loads(line[6:])["usage"]["completion_tokens"]

    def _fail(self, exc: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._fail(ConnectionError("the server closed the connection"))


async def connect(url: str) -> LightStream:
    parts = urlsplit(url)
    _, stream = await asyncio.get_running_loop().create_connection(LightStream, parts.hostname, parts.port)
    return stream
