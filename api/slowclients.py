"""Deadlines against slow clients: a request's headers, and its body, must arrive within a stated time.

A client that opens connections and dribbles bytes would otherwise hold a
connection (and its memory) for as long as it likes: uvicorn bounds only the
idle time between requests, and any byte resets it. Two deadlines, as
nginx's `client_header_timeout` and `client_body_timeout` (60 s there):

* **Headers**: from a connection's start, or the end of its previous
  response, its request line and headers must be complete within
  `header_timeout_s`, or the connection is closed (`HeaderDeadline`, a
  uvicorn HTTP protocol).
* **Body**: once the headers are in, the whole body must be within
  `body_timeout_s`, or the request is answered 408 in OpenAI's error shape
  and the connection closed (`BodyDeadline`, ASGI middleware).

The protocol also offers each request three extensions: `fsched.abort`, with
which a stream whose client stopped reading closes the connection;
`fsched.body`, with which a stream writes its body's pieces to the
transport itself (each in its HTTP chunk), not through every middleware's
`send` and h11's state machine, at each token; and `fsched.body_now`, the
same piece written from a plain call (a daemon link's push), when the
transport takes it without waiting; and `fsched.hold`, with which what is
written until the end of the loop pass goes out in one system call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import h11
from h11._writers import ChunkedWriter
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: h11's protocol alone
    HttpToolsProtocol = None

from fsched.api.errors import BodyRefused, run_refusing

ABORT = "fsched.abort"  # a scope extension: close this request's connection, the response unfinished
BODY = "fsched.body"  # a scope extension: write a piece of the started response's body (more to come)
# A scope extension: write a piece of the started response's body now, without waiting, when the
# transport takes it at once (else False, and nothing is made or written).
BODY_NOW = "fsched.body_now"
# A scope extension: hold the connection's writes until the end of this loop pass, then write them as one
# (a stream's head and first piece, its last piece and its end: one system call, not two).
HOLD = "fsched.hold"


@dataclass(slots=True, frozen=True)
class ClientDeadlines:
    # A request's headers are a few hundred bytes: 10 s is ample on any link, short for an attacker.
    header_timeout_s: float = 10.0
    # A body is at most the upload limit (200 MiB): 120 s is 1.7 MB/s, a slow uplink's pace.
    body_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not (0 < self.header_timeout_s <= 3600 and 0 < self.body_timeout_s <= 3600):
            raise ValueError("client deadlines must be within (0, 3600] seconds")


class _Deadline:
    """What serve's HTTP protocols add to uvicorn's (h11's or httptools'): a connection whose request
    headers are not in on time is closed, and each request gets the extensions above.

    It also closes as nginx's `lingering_close` does: a connection closed
    while the client is still sending a body (an early 413) first sends its
    FIN and reads and drops what still comes, for at most LINGER_S, so the
    client reads the answer instead of a reset.

    A protocol class says when a request's headers are in (`_headers_in`),
    whether its client is still sending a body (`_client_sending`) and how a
    body piece is framed (`_write_piece`).
    """

    header_timeout_s = ClientDeadlines().header_timeout_s

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(_Lingering(transport, self))
        self._deadline = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            return  # the answer is sent: what the client still sends is dropped
        super().data_received(data)

    def eof_received(self) -> None:
        if self.transport.lingering:
            self.transport.close_now()

    def _headers_in(self, cycle) -> None:
        """A request's headers are in: its extensions, and no more deadline until its response ends."""
        extensions = cycle.scope.setdefault("extensions", {})
        if ABORT not in extensions:
            extensions[ABORT] = partial(self._abort, cycle)
            extensions[BODY] = partial(self._body, cycle)
            extensions[BODY_NOW] = partial(self._body_now, cycle)
            extensions[HOLD] = self.transport.hold
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _abort(self, cycle) -> None:
        """Close the connection: the app is done with a client that took no bytes (uvicorn then sees a
        client gone, not a response left unfinished to log as an error)."""
        cycle.disconnected = True
        self.transport.close()

    async def _body(self, cycle, data: bytes) -> None:
        """A piece of a started response's body, more to come: what uvicorn's `send` does with it,
        its chunk framed here when the response is chunked."""
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected or not data or cycle.scope["method"] == "HEAD":
            return
        if not cycle.response_started or cycle.response_complete:
            raise RuntimeError("a body piece outside a started response")
        self._write_piece(cycle, data)

    def _body_now(self, cycle, render: Callable[[Any], bytes], arg: Any) -> bool:
        """`_body`'s piece, made by `render(arg)` and written at once, when nothing would wait: the
        transport is not paused by a full buffer and the client is still there. False otherwise
        (`render` not called): the caller then writes through `_body`, under its stall bound."""
        if (cycle.flow.write_paused or cycle.disconnected or not cycle.response_started
                or cycle.response_complete):
            return False
        data = render(arg)
        if data and cycle.scope["method"] != "HEAD":
            self._write_piece(cycle, data)
        return True

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class HeaderDeadline(_Deadline, H11Protocol):
    """uvicorn's h11 protocol under the deadlines (where httptools is not installed)."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._waiting_for = None
        super().connection_made(transport)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._waiting_for:
            self._waiting_for = self.cycle
            self._headers_in(self.cycle)

    def on_response_complete(self) -> None:
        self._arm()  # the next request's headers; a pipelined one disarms it at once
        super().on_response_complete()

    def _client_sending(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY

    def _write_piece(self, cycle, data: bytes) -> None:
        if type(getattr(self.conn, "_writer", None)) is ChunkedWriter:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.transport.write(self.conn.send(h11.Data(data=data)) or b"")


if HttpToolsProtocol is not None:
    class FastHeaderDeadline(_Deadline, HttpToolsProtocol):
        """uvicorn's httptools protocol under the deadlines: its parser costs a fraction of h11's."""

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            if self.cycle is not None and self.cycle.scope is self.scope:  # not an upgrade refused
                self._headers_in(self.cycle)

        def on_response_complete(self) -> None:
            if not self.pipeline:  # a pipelined request's headers are in already
                self._arm()
            super().on_response_complete()

        def _client_sending(self) -> bool:
            return self.cycle is not None and self.cycle.more_body

        def _write_piece(self, cycle, data: bytes) -> None:
            if cycle.chunked_encoding:
                self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                return
            if len(data) > cycle.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            cycle.expected_content_length -= len(data)
            self.transport.write(data)
else:
    FastHeaderDeadline = None


LINGER_S = 2.0


class _Lingering:
    """A transport whose close() lingers while the client is still sending a request body."""

    def __init__(self, transport, protocol: _Deadline):
        self._transport = transport
        self._protocol = protocol
        self.lingering = False
        self.write = transport.write  # every streamed token: no lookup through __getattr__
        self._held: list[bytes] | None = None

    def hold(self) -> None:
        """Keep what is written from now to the end of this loop pass, and write it then in one piece."""
        if self._held is None:
            self._held = []
            self.write = self._held.append
            self._protocol.loop.call_soon(self.release)

    def release(self) -> None:
        held, self._held = self._held, None
        self.write = self._transport.write
        if held and not self._transport.is_closing():
            self._transport.write(b"".join(held))

    def __getattr__(self, name: str):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self._held is not None:
            self.release()
        sending = self._protocol._client_sending()
        if self.lingering or not sending or not self._transport.can_write_eof():
            self.close_now()
            return
        self.lingering = True
        self._transport.write_eof()
        self._protocol.loop.call_later(LINGER_S, self.close_now)

    def close_now(self) -> None:
        if not self._transport.is_closing():
            self._transport.close()


def header_deadline_protocol(timeout_s: float, parser: str = "auto") -> type[_Deadline]:
    """The protocol class for uvicorn's `http` setting, with this header timeout: httptools' parser
    where it is installed (`parser` "auto"), else (or "h11") h11's."""
    base = FastHeaderDeadline if parser == "auto" and FastHeaderDeadline is not None else HeaderDeadline
    return type("HeaderDeadlineProtocol", (base,), {"header_timeout_s": timeout_s})


class BodyTooSlow(BodyRefused):
    def __init__(self, timeout_s: float):
        super().__init__(408, f"the request body did not arrive within {timeout_s:g} s")


class BodyDeadline:
    """ASGI middleware: a request's whole body within `timeout_s` of its headers, else 408."""

    def __init__(self, app, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        body_done = False

        async def timed_receive():
            nonlocal body_done
            if body_done:  # afterwards receive() only waits for a disconnect: no deadline
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):  # a timer, no task
                    message = await receive()
            except TimeoutError:
                raise BodyTooSlow(self.timeout_s) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await run_refusing(self.app, scope, timed_receive, send)
