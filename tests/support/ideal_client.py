"""The ideal client of an engine: what a relay in front of it is measured against.

asyncio, one connection per stream (as many at once as `concurrency`),
requests written by hand, every server-sent event parsed (JSON) and its
`token_ids` counted; nothing else. `run(url, bodies, concurrency)` streams
every body of `/v1/completions` and returns the tokens of each, the wall
time from the first request sent to the last stream ended, and each
stream's first-token time.
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


async def _one(host: str, port: int, path: str, body: dict) -> tuple[list[int], float]:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                 % (path.encode(), host.encode(), len(data), data))
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"the engine answered {status!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    tokens: list[int] = []
    first = 0.0
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            break
        chunk = await reader.readexactly(size + 2)
        for line in chunk.split(b"\n"):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                ids = choice.get("token_ids") or ()
                if ids and not tokens:
                    first = time.perf_counter() - start
                tokens.extend(ids)
    writer.close()
    return tokens, first


async def _run(url: str, bodies: list[dict], concurrency: int) -> Run:
    parts = urlsplit(url)
    todo = list(enumerate(bodies))
    todo.reverse()
    tokens: list[list[int]] = [[] for _ in bodies]
    firsts = [0.0] * len(bodies)

    async def worker() -> None:
        while todo:
            i, body = todo.pop()
            tokens[i], firsts[i] = await _one(parts.hostname, parts.port, "/v1/completions", body)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Run(tokens, time.perf_counter() - start, firsts)


def run(url: str, bodies: list[dict], concurrency: int) -> Run:
    """Stream every body to the engine at `url`, `concurrency` at a time."""
    return asyncio.run(_run(url, bodies, concurrency))
