"""The ideal client of an engine: what a relay in front of it is measured against.

asyncio, one connection per stream (as many at once as `concurrency`), a
protocol object per connection reading bytes as they arrive (no stream
reader), the request written by hand, the chunked body and its server-sent
events parsed, every event's JSON decoded and its `token_ids` kept; nothing
else. `run(url, bodies, concurrency)` streams every body of
`/v1/completions` and returns the tokens of each, the wall time from the
first request sent to the last stream ended, and each stream's first-token
time.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(slots=True)
class Run:
    tokens: list[list[int]]  # per body, in the order given
    wall_s: float
    first_token_s: list[float]  # per body, from its request sent

    @property
    def total(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tok_s(self) -> float:
        return self.total / self.wall_s if self.wall_s else 0.0


class ChunkedEvents(asyncio.Protocol):
    """A streamed HTTP/1.1 answer read as it comes: its head (anything but 200 fails), then its chunks,
    each chunk's payload handed to `_events`, and `_ended` at the last chunk. The buffer is left
    empty at the end, so a keep-alive connection can read its next answer."""

    def __init__(self) -> None:
        self.buf, self.head = b"", False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.head:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if b" 200 " not in self.buf[: self.buf.find(b"\r\n")]:
                self._fail(RuntimeError(f"answered {self.buf[:300]!r}"))
                return
            self.head, self.buf = True, self.buf[end + 4 :]
        while (eol := self.buf.find(b"\r\n")) >= 0:
            size = int(self.buf[:eol], 16)
            if len(self.buf) < eol + 4 + size:
                return
            payload = self.buf[eol + 2 : eol + 2 + size]
            self.buf = self.buf[eol + 4 + size :]
            if size == 0:
                self._ended()
                return
            self._events(payload)

    def _events(self, payload: bytes) -> None:
        raise NotImplementedError

    def _ended(self) -> None:
        raise NotImplementedError

    def _fail(self, exc: Exception) -> None:
        raise NotImplementedError


class _Reader(ChunkedEvents):
    """One streamed response of the engine: the token ids of its events."""

    def __init__(self, done: asyncio.Future):
        super().__init__()
        self.done = done
        self.tokens: list[int] = []
        self.start = time.perf_counter()
        self.first = 0.0

    def _events(self, payload: bytes) -> None:
        for line in payload.split(b"\n"):
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    if (ids := choice.get("token_ids")) and not self.tokens:
                        self.first = time.perf_counter() - self.start
                    self.tokens += ids or ()

    def _ended(self) -> None:
        if not self.done.done():
            self.done.set_result(self.tokens)

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def connection_lost(self, exc) -> None:
        self._fail(ConnectionError("the engine closed the stream early"))


async def _one(host: str, port: int, body: dict) -> tuple[list[int], float]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, reader = await loop.create_connection(lambda: _Reader(done), host, port)
    data = json.dumps(body).encode()
    transport.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                    b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                    % (host.encode(), len(data), data))
    try:
        tokens = await done
    finally:
        transport.close()
    return tokens, reader.first


async def _run(url: str, bodies: list[dict], concurrency: int) -> Run:
    parts = urlsplit(url)
    todo = list(enumerate(bodies))
    todo.reverse()
    tokens: list[list[int]] = [[] for _ in bodies]
    firsts = [0.0] * len(bodies)

    async def worker() -> None:
        while todo:
            i, body = todo.pop()
            tokens[i], firsts[i] = await _one(parts.hostname, parts.port, body)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Run(tokens, time.perf_counter() - start, firsts)


def run(url: str, bodies: list[dict], concurrency: int) -> Run:
    """Stream every body to the engine at `url`, `concurrency` at a time."""
    return asyncio.run(_run(url, bodies, concurrency))
