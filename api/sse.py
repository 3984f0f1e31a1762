"""Server-sent events with a bound on a client that stops reading.

A stream is written as fast as the client takes it: when its socket's
buffers are full, the write waits (backpressure: nothing piles up in the
server beyond the transport's buffer). A write that waits longer than
`stall_s` ends the response: the connection is closed, and the stream's own
`finally` cancels its request.

A client that goes away (it hangs up, or stalls past the bound) is one INFO
line in serve's log, never a traceback: any tenant can do it at will.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from fsched.api.hangup import HangUp
from fsched.api.slowclients import ABORT, BODY, BODY_NOW, HOLD
from fsched.core.jobs.jsontext import dumps as json_text

log = logging.getLogger("fsched.serve")

KEEPALIVE = ": keep-alive\n\n"


def sse(obj: dict) -> str:
    return f"data: {json_text(obj, separators=(',', ':'))}\n\n"


class LastPiece(str):
    """A stream's last piece (its ending events): written with the response's end in one write."""

    __slots__ = ()


class ClientStalled(Exception):
    """The client took no bytes for the stated bound."""


class Outlet:
    """A stream's way to write a piece at once from a plain call (a daemon link's push), without its
    generator: only while its response is open and its transport takes bytes without waiting."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now: Callable[[Callable[[Any], bytes], Any], bool] | None = None

    def write_now(self, render: Callable[[Any], bytes], arg: Any) -> bool:
        """Write what `render(arg)` makes, now; False (`render` not called) when it would wait or the
        server offers no such write. (A function and its argument, not a closure: one is made a token.)"""
        return self.now is not None and self.now(render, arg)


class BoundedStream(StreamingResponse):
    def __init__(self, content, stall_s: float, outlet: Outlet | None = None, hang_up: HangUp | None = None,
                 **kwargs):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                         **kwargs)
        self.stall_s = stall_s
        self.outlet = outlet
        self.ended = False  # the last byte of the stream was sent
        self._write_body = None  # the server's `fsched.body` extension, when it offers it
        self._scope_now = None  # and its `fsched.body_now`
        self.hang_up = hang_up  # the request's watcher of its client (one of its own if not given)
        self._hold = None  # the server's `fsched.hold`, when it offers it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The stream in the handler's own task, cancelled if the client hangs up while it runs (by the
        request's watcher, api/hangup.py: Starlette's way is a task group of two tasks); its `finally`
        cancels an unfinished request either way."""
        self._write_body = scope.get("extensions", {}).get(BODY)
        self._scope_now = scope.get("extensions", {}).get(BODY_NOW)
        self._hold = scope.get("extensions", {}).get(HOLD)
        task = asyncio.current_task()
        if self.hang_up is None:
            self.hang_up = HangUp(receive)
        hang_up = self.hang_up
        hang_up.arm(task)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not hang_up.cancelled or task.uncancel() > 0:  # not the hang-up's alone (the server stopping)
                raise
            _gone(scope, "disconnected")
        except ClientStalled:
            abort = scope.get("extensions", {}).get(ABORT)
            if abort is not None:  # its buffers are full: not even the end can be sent
                abort()
            _gone(scope, f"took no bytes for {self.stall_s:g} s")
        except (ClientDisconnect, OSError):
            _gone(scope, "disconnected")
        finally:
            hang_up.disarm()
            hang_up.stop()

    async def stream_response(self, send: Send) -> None:
        """The head, the pieces as they come, the end. Where the server offers `fsched.hold`, the head goes
        out with the pieces made in the same loop pass (an opening, a first token already in), and the
        last piece with the end: two writes a stream fewer, the same bytes."""
        hold = self._hold
        if hold is not None:
            hold()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        watchdog = _Watchdog(self.stall_s)
        write = self._write_body
        if self.outlet is not None and write is not None:  # pieces between this loop's writes
            self.outlet.now = self._scope_now
        try:
            async for chunk in self.body_iterator:
                if hold is not None and type(chunk) is LastPiece:
                    hold()
                body = chunk.encode(self.charset) if isinstance(chunk, str) else chunk
                with watchdog:
                    if write is not None:  # straight to the transport: no middleware sees a body piece
                        await write(body)
                    else:
                        await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.ended = True
        finally:
            if self.hang_up is not None:  # a hang-up from here on cancels nothing: the `finally` is the end
                self.hang_up.disarm()
            if self.outlet is not None:
                self.outlet.now = None
            watchdog.stop()
            await self.body_iterator.aclose()  # its `finally` cancels an unfinished request


def _gone(scope: Scope, why: str) -> None:
    host, port = scope.get("client") or ("?", 0)
    log.info("client %s:%s left its stream (%s %s) before the end: it %s; its request is cancelled",
             host, port, scope.get("method", "?"), scope.get("path", "?"), why)


class _Watchdog:
    """Cuts off a write that waits longer than `stall_s`: one timer for the whole stream, re-armed
    only when it fires (a timeout around every write would cost a task and a timer per token).

    The write is cancelled exactly `stall_s` after it started: the timer, firing
    while no write waits, sleeps `stall_s` again; firing while one does, it
    cancels it if it has waited that long, else fires again when it will have."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._since: float | None = None
        self._stalled = False
        self._timer = self._loop.call_later(stall_s, self._check)

    def __enter__(self) -> None:
        self._since = self._loop.time()

    def __exit__(self, kind, exc, tb) -> None:
        self._since = None
        if self._stalled and kind is asyncio.CancelledError:
            self._task.uncancel()
            raise ClientStalled from None

    def _check(self) -> None:
        now = self._loop.time()
        if self._since is not None and now - self._since >= self.stall_s:
            self._stalled = True
            self._task.cancel()
            return
        start = now if self._since is None else self._since
        self._timer = self._loop.call_at(start + self.stall_s, self._check)

    def stop(self) -> None:
        self._timer.cancel()
