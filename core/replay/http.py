"""A small HTTP/1.1 client on asyncio streams: JSON calls and server-sent event streams.

The replayer's only network code. The standard library's, not an HTTP
package: fsched's base install has no HTTP client (httpx comes with the test
extra only), and this one does what a replay needs, one connection a
request, a body read by length or in chunks, `data:` lines of an event
stream, TLS for https, at the least CPU per streamed token (the client
shares the machine with what it measures).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # a response's status line and headers


class ServerError(Exception):
    """An endpoint that cannot be reached, or an answer that is not HTTP; the message says which."""


@dataclass(slots=True, frozen=True)
class ServerAddress:
    """Where an OpenAI-compatible server listens: `http(s)://host[:port][/prefix]`."""

    url: str
    host: str
    port: int
    tls: bool
    prefix: str  # the path before /v1/...

    @classmethod
    def parse(cls, url: str) -> ServerAddress:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url: expected http://HOST[:PORT] or https://..., got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"--url: bad port in {url!r}") from None
        prefix = parts.path.rstrip("/").removesuffix("/v1")
        return cls(url.strip().rstrip("/"), parts.hostname, port, parts.scheme == "https", prefix)


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()

    async def body(self) -> bytes:
        """The whole body (then the connection is closed)."""
        try:
            return b"".join([piece async for piece in self.pieces()])
        finally:
            self.close()

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it comes: chunks undone, or up to Content-Length, or to the connection's end."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await self.reader.readline()).split(b";", 1)[0].strip() or b"0", 16):
                yield (await self.reader.readexactly(size + 2))[:-2]
            return
        length = self.headers.get("content-length")
        if length is not None:
            yield await self.reader.readexactly(int(length))
            return
        while data := await self.reader.read(65536):
            yield data

    async def events(self) -> AsyncIterator[bytes]:
        """The payload of each `data:` line of an event stream, as its line completes."""
        rest = b""
        async for piece in self.pieces():
            rest += piece
            *lines, rest = rest.split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    yield line[5:].strip()


async def request(endpoint: ServerAddress, method: str, path: str, headers: Mapping[str, str] | None = None,
                  body: dict | None = None) -> Response:
    """Send one request on a new connection; the response's head read, its body left to read."""
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {endpoint.prefix}{path} HTTP/1.1", f"Host: {endpoint.host}:{endpoint.port}",
            "Connection: close", "Accept: */*", f"Content-Length: {len(data)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    try:
        reader, writer = await asyncio.open_connection(
            endpoint.host, endpoint.port, ssl=ssl.create_default_context() if endpoint.tls else None,
            limit=MAX_HEAD)
    except (OSError, ssl.SSLError) as exc:
        raise ServerError(f"cannot connect to {endpoint.url}: {exc.strerror or exc}") from None
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        status, fields = _head(await reader.readuntil(b"\r\n\r\n"), endpoint)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        writer.close()
        raise ServerError(f"{endpoint.url}{path}: the connection broke before an answer: {exc!r}") from None
    return Response(status, fields, reader, writer)


def _head(raw: bytes, endpoint: ServerAddress) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ServerError(f"{endpoint.url} does not answer HTTP (it said {lines[0][:80]!r})")
    fields = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return int(parts[1]), fields


async def call_json(endpoint: ServerAddress, method: str, path: str, headers: Mapping[str, str] | None = None,
                    body: dict | None = None) -> tuple[int, object]:
    """(status, the answer's JSON, or its text when it is not JSON)."""
    response = await request(endpoint, method, path, headers, body)
    raw = await response.body()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", "replace")


def error_message(answer: object) -> str:
    """The message of an OpenAI-style error answer (`{"error": {"message": ...}}`), else the answer."""
    if isinstance(answer, dict):
        err = answer.get("error", answer.get("detail", answer))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        return str(err)[:300]
    return str(answer)[:300]
