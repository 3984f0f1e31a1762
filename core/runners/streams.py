"""Every streamed completion of one engine, read by one selector in the caller's thread.

No thread per stream and no queue: `open` writes a raw HTTP/1.1 request on
a non-blocking socket (at once when its connection is up, else once `poll`
finds it is), and `poll(timeout)` reads whatever has arrived on any
of them, parsing the response incrementally from bytes (status line,
headers, chunked transfer or a body until close, server-sent events). What
a stream received waits on the stream itself until its reader takes it:
token ids in one list, the chunks' `logprobs` objects in another, and once
it ends its finish reason, or an error with its fault:
- `Fault.UNAVAILABLE`: the engine could not be reached, reset the
  connection, answered 502/503/504, cut the stream short or went silent
  past the read timeout: try again later;
- `Fault.REFUSED`: the engine answered the request with an error of its
  own (a prompt over its context, a bad parameter): retrying would not help.
`abort` closes a stream's socket; the engine sees the disconnect and frees
the request (vLLM aborts a request whose client went away).

Connections are kept alive: a stream that ended whole (its answer's last
chunk read) leaves its connection idle for the next `open`, which saves the
engine's server a connection's set-up and tear-down a request (measured on
uvicorn: 180-185 µs of its CPU a request on a new connection, 75-135 on a
kept one) and this side the socket, connect and close. An idle connection
is used again only while it is young (`IDLE_KEEP_S`, well inside the
keep-alive timeouts servers use, 5 s for uvicorn's default) and still open;
should the server have closed it all the same before it answered anything,
the request goes again on a new connection, once.
"""

from __future__ import annotations

import enum
import errno
import json
import os
import re
import select
import socket
import time
from dataclasses import dataclass, field

from fsched.core.stamps import stamp

CONNECT, SEND, HEAD, BODY = range(4)
READ_SIZE = 1 << 16
# Deadlines (connect, read) are checked this often: a timeout is a rare fault, not a per-read cost.
DEADLINE_CHECK_S = 0.5
IDLE_KEEP_S = 2.0  # an idle connection is used again this long at most (servers close theirs after ~5 s)
IDLE_MAX = 1024  # idle connections kept at most
DRAIN_S = 1.0  # an ended stream's last chunk waited for this long at most before its connection is closed


class Fault(enum.StrEnum):
    UNAVAILABLE = "unavailable"
    REFUSED = "refused"


def take_arrived(stream) -> tuple[list[int], list[tuple[dict, int]]]:
    """The tokens (and logprobs objects) that arrived on a stream since the last take (a method of the
    streams of both readers: `Stream` here, the front's in core/runners/front_link.py)."""
    tokens, logprobs = stream.tokens, stream.logprobs
    stream.tokens = []
    if logprobs:
        stream.logprobs = []
    return tokens, logprobs


@dataclass(slots=True, eq=False)
class Stream:
    """One streamed completion: what arrived and was not taken yet, and how it ended."""

    sock: socket.socket
    request: bytes  # what is left to send
    owner: object = None  # whoever reads this stream (the runner's record of the request)
    tokens: list[int] = field(default_factory=list)  # arrived, not taken
    logprobs: list[tuple[dict, int]] = field(default_factory=list)  # (a chunk's logprobs object, its tokens)
    finish: str | None = None  # the engine ended the stream (stop, length)
    error: str | None = None
    fault: Fault | None = None
    state: int = CONNECT
    status: int = 0
    chunked: bool = False
    length: int = -1  # an error answer's Content-Length (-1: until close)
    buf: bytes = b""  # received, not parsed yet (HTTP framing)
    sse: bytes = b""  # body bytes, not parsed yet (events)
    last: str | None = None  # the last finish_reason an event named
    deadline: float = 0.0
    closed: bool = False
    plain: bool = True  # its reader wants token ids and the finish reason only (no logprobs)
    ended: bool = False  # a finish reason or an error: nothing more will come
    keep_alive: bool = False  # the answer's head lets the connection serve another request
    reused: bool = False  # sent on a connection kept from an earlier stream, nothing read back yet
    payload: bytes = b""  # the whole request (sent again on a new connection if a kept one was dead)

    take = take_arrived


class WakeWaits:
    """The daemon's wake descriptor in a reader of an engine's tokens (`Streams` here, the front's streams in
    core/runners/front_link.py): readable, it ends a poll's wait (`woken` then says so) or a `pause`."""

    _wake_fd: int | None = None
    _wake_poller: Poller | None = None  # the wake descriptor alone (`pause`)
    woken = False  # the wake descriptor was readable at the last poll (or pause)

    def wake_on(self, fd: int) -> None:
        """A descriptor that ends a poll's wait when it becomes readable (its owner drains it):
        the caller has something better to do than wait for tokens."""
        self._wake_fd = fd
        self._wake_poller = Poller()
        self._wake_poller.register(fd, select.POLLIN)
        self._watch_wake(fd)

    def _watch_wake(self, fd: int) -> None:
        """Have the reader's own poll watch the wake descriptor too."""
        raise NotImplementedError

    def pause(self, timeout: float) -> bool:
        """Wait `timeout` s without reading the streams (what they send waits for the next `poll`),
        ending early when the wake descriptor becomes readable; whether it did (then `woken`)."""
        if self._wake_poller is None:
            time.sleep(timeout)
            return False
        if not self._wake_poller.poll(max(0.0, timeout)):
            return False
        self.woken = True
        return True


class Streams(WakeWaits):
    """An engine's open streams, multiplexed on one selector."""

    whole_iterations = False  # each stream's events come on their own: an iteration's arrive over a while

    def __init__(self, host: str, port: int, path: str, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 600.0):
        self.host, self.port, self.path = host, port, path
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self._poller = Poller()
        self._open: dict[int, Stream] = {}  # by socket descriptor
        self._draining: dict[int, Stream] = {}  # ended whole but for the answer's last chunk
        self._idle: list[tuple[socket.socket, float]] = []  # kept connections, when each fell idle
        self.connections_reused = 0  # answers read on a kept connection
        self._next_deadline_check = 0.0
        self._address: tuple | None = None

    def _watch_wake(self, fd: int) -> None:
        self._poller.register(fd, select.POLLIN)

    def __len__(self) -> int:
        return len(self._open)

    def open(self, body: dict, owner: object = None, plain: bool | None = None) -> Stream:
        """Start a streamed completion of `body` (its events come in through `poll`); `plain`: its
        reader wants no logprobs (by default: the body asks for none)."""
        data = json.dumps(body, separators=(",", ":")).encode()
        request = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                   f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                   f"Content-Length: {len(data)}\r\n\r\n").encode() + data
        plain = body.get("logprobs") is None if plain is None else plain
        kept = self._kept()
        if kept is not None:
            stream = Stream(kept, request, owner, state=SEND, plain=plain, reused=True, payload=request,
                            deadline=time.monotonic() + self.connect_timeout_s)
            self._open[kept.fileno()] = stream
            self._poller.register(kept.fileno(), select.POLLOUT)
            self._send(stream)
            return stream
        stream = Stream(None, request, owner, plain=plain, payload=request)  # type: ignore[arg-type]
        self._connect(stream)
        return stream

    def _connect(self, stream: Stream) -> None:
        """`stream`'s request on a new connection: sent at once when it is up, else at a later poll."""
        try:
            family, address = self._resolve()
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            stream.sock, stream.closed = socket.socket(), True
            stream.sock.close()
            _fail(stream, f"cannot reach the engine: {exc}", Fault.UNAVAILABLE)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream.sock, stream.state = sock, CONNECT
        stream.deadline = time.monotonic() + self.connect_timeout_s
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            _fail(stream, f"cannot connect to the engine: {os.strerror(code)}", Fault.UNAVAILABLE)
            stream.closed = True
            sock.close()
            return
        self._open[sock.fileno()] = stream
        self._poller.register(sock.fileno(), select.POLLOUT)
        if code == 0 or _writable(sock):
            # Connected already (an engine on this machine or near it): the request goes now, not at
            # the next poll, which may come only after a whole batch's tokens are read (a step later).
            self._send(stream)

    def _kept(self) -> socket.socket | None:
        """The youngest idle connection still fit to use, if any (the older ones are closed)."""
        now = time.monotonic()
        while self._idle:
            sock, since = self._idle.pop()
            if now - since <= IDLE_KEEP_S and _quiet(sock):
                return sock
            sock.close()
            if now - since > IDLE_KEEP_S:  # the rest are older still
                for older, _ in self._idle:
                    older.close()
                self._idle.clear()
        return None

    def _keep(self, stream: Stream) -> None:
        """An ended stream's connection, its answer read whole, kept idle for the next request."""
        stream.closed = True  # to its reader it is done: an `abort` now must not close the kept socket
        if len(self._idle) >= IDLE_MAX:
            stream.sock.close()
        else:
            self._idle.append((stream.sock, time.monotonic()))

    def _resolve(self) -> tuple[int, tuple]:
        if self._address is None:
            family, _, _, _, address = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
            self._address = (family, address)
        return self._address

    def abort(self, stream: Stream) -> None:
        """Stop reading and drop the connection (the engine aborts the request)."""
        if not stream.closed:
            stream.closed = True
            fd = stream.sock.fileno()
            self._poller.unregister(fd)
            del self._open[fd]
            stream.sock.close()

    def close(self) -> None:
        for stream in list(self._open.values()):
            self.abort(stream)
        for fd, stream in list(self._draining.items()):
            self._poller.unregister(fd)
            stream.sock.close()
        self._draining.clear()
        for sock, _ in self._idle:
            sock.close()
        self._idle.clear()

    def poll(self, timeout: float) -> list[Stream]:
        """Read what has arrived, waiting up to `timeout` s for something; the streams with news."""
        if not self._open and not self._draining and self._wake_fd is None:
            if timeout > 0:
                time.sleep(timeout)
            return []
        news = []
        ready = self._poller.poll(max(0.0, timeout))
        now = time.monotonic()
        streams = self._open
        self.woken = False
        for fd, mask in ready:
            if fd == self._wake_fd:
                self.woken = True
                continue
            stream = streams.get(fd)
            if stream is None:
                self._drain(self._draining[fd], now)
                continue
            if mask & select.POLLOUT:
                self._send(stream)
            elif self._read(stream, now):
                news.append(stream)
        if now >= self._next_deadline_check:
            self._next_deadline_check = now + DEADLINE_CHECK_S
            news += self._expired(now)
            for fd, stream in list(self._draining.items()):
                if stream.deadline < now:
                    self._drop_draining(fd)
        return news

    # -- writing the request ---------------------------------------------------------------
    def _send(self, stream: Stream) -> None:
        sock = stream.sock
        if stream.state == CONNECT:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                return self._end(stream, f"cannot connect to the engine: {os.strerror(code)}",
                                 Fault.UNAVAILABLE)
            stream.state = SEND
        try:
            sent = sock.send(stream.request)
        except OSError as exc:
            if stream.reused:
                return self._again(stream)
            return self._end(stream, f"{type(exc).__name__}: {exc}", Fault.UNAVAILABLE)
        stream.request = stream.request[sent:]
        if not stream.request:
            stamp("sent", getattr(getattr(stream.owner, "request", None), "job_id", 0))
            stream.state = HEAD
            stream.deadline = time.monotonic() + self.read_timeout_s
            self._poller.modify(sock.fileno(), select.POLLIN)

    # -- reading the response --------------------------------------------------------------
    def _read(self, stream: Stream, now: float) -> bool:
        """Read and parse what arrived on `stream`; whether it has news for its reader."""
        try:
            data = stream.sock.recv(READ_SIZE)
        except BlockingIOError:
            return False
        except OSError as exc:
            if stream.reused:  # a kept connection the server had closed: nothing of the answer came
                self._again(stream)
                return stream.ended
            self._end(stream, f"{type(exc).__name__}: {exc}", Fault.UNAVAILABLE)
            return True
        if stream.reused:
            if not data:
                self._again(stream)
                return stream.ended
            stream.reused = False
            self.connections_reused += 1
        received(stream, data)
        stream.deadline = 0.0 if stream.ended else now + self.read_timeout_s
        if stream.ended and not stream.closed:
            self._ended(stream, now)
        return bool(stream.tokens) or stream.ended

    def _again(self, stream: Stream) -> None:
        """A kept connection was dead before it answered: the whole request again on a new one."""
        fd = stream.sock.fileno()
        self._poller.unregister(fd)
        del self._open[fd]
        stream.sock.close()
        stream.request, stream.reused = stream.payload, False
        self._connect(stream)

    def _ended(self, stream: Stream, now: float) -> None:
        """A stream ended: its connection kept when its answer is whole and reusable, waited for when
        only the answer's last chunk is still to come, else closed."""
        if not (stream.keep_alive and stream.error is None and stream.finish is not None):
            return self.abort(stream)
        fd = stream.sock.fileno()
        if stream.length >= 0 and not stream.buf:  # the last chunk read: the answer is whole
            self._poller.unregister(fd)
            del self._open[fd]
            return self._keep(stream)
        del self._open[fd]
        stream.closed, stream.deadline = True, now + DRAIN_S
        self._draining[fd] = stream

    def _drain(self, stream: Stream, now: float) -> None:
        """What comes on an ended stream's connection: the answer's last chunk (then kept), or
        anything else (then closed)."""
        fd = stream.sock.fileno()
        try:
            data = stream.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            _dechunk(stream, stream.buf + data)
        if data and stream.length >= 0 and not stream.buf:
            self._poller.unregister(fd)
            del self._draining[fd]
            self._keep(stream)
        elif not data or stream.length >= 0:
            self._drop_draining(fd)

    def _drop_draining(self, fd: int) -> None:
        stream = self._draining.pop(fd)
        self._poller.unregister(fd)
        stream.sock.close()

    def _expired(self, now: float) -> list[Stream]:
        late = [stream for stream in self._open.values() if 0 < stream.deadline < now]
        for stream in late:
            what = "connecting to" if stream.state in (CONNECT, SEND) else "waiting for"
            self._end(stream, f"TimeoutError: timed out {what} the engine", Fault.UNAVAILABLE)
        return late

    def _end(self, stream: Stream, error: str, fault: Fault) -> None:
        _fail(stream, error, fault)
        self.abort(stream)


class Poller:
    """The descriptors' readiness: epoll where there is one (Linux), else poll; timeouts in seconds.
    Used directly, not through `selectors`, whose objects per ready descriptor cost a token's worth."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._poll = None if self._epoll is not None else select.poll()

    def register(self, fd: int, events: int) -> None:
        (self._epoll or self._poll).register(fd, events)

    def modify(self, fd: int, events: int) -> None:
        (self._epoll or self._poll).modify(fd, events)

    def unregister(self, fd: int) -> None:
        (self._epoll or self._poll).unregister(fd)

    def poll(self, timeout_s: float) -> list[tuple[int, int]]:
        if self._epoll is not None:
            return self._epoll.poll(timeout_s)
        return self._poll.poll(timeout_s * 1000)


def _quiet(sock: socket.socket) -> bool:
    """Whether an idle kept connection is still open with nothing unread (a server that closed it, or
    sent anything, makes it readable)."""
    try:
        sock.recv(1, socket.MSG_PEEK)  # b"": closed; a byte: something no request asked for
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


def _writable(sock: socket.socket) -> bool:
    """Whether a socket whose connect is in progress can take bytes now (its connection is up)."""
    poll = select.poll()
    poll.register(sock, select.POLLOUT)
    return bool(poll.poll(0))


def received(stream: Stream, data: bytes) -> None:
    """Parse what arrived on `stream` (b"": the engine closed the connection)."""
    if stream.state != BODY or stream.status != 200:
        stream.buf += data
        _framed(stream)
    elif stream.chunked:
        if stream.buf or stream.sse or not _one_plain_event(stream, data):
            _chunks(stream, stream.buf + data if stream.buf else data)
    elif data:
        _events(stream, stream.sse + data if stream.sse else data)
    if not data and not stream.ended:
        _eof(stream)


def _one_plain_event(stream: Stream, data: bytes) -> bool:
    """The common read of a plain stream, taken in one pass: one whole HTTP chunk that holds one whole
    one-line `data:` event with a plain chunk (`_plain_chunk`). False, having taken nothing, for any
    other read (several chunks or events, a part of one, the end, an error): the general path reads it.
    """
    if not stream.plain or stream.ended:
        return False
    one = _ONE_EVENT.fullmatch(data)
    if one is None or int(one[1], 16) != len(one[2]):
        return False
    fast = _plain_chunk(one[3].strip())
    if fast is None:
        return False
    stream.tokens += fast[0]
    if fast[1] is not None:
        stream.last = fast[1]
    return True


# A read that is one HTTP chunk (its size in hex, no extension) of one event of one `data:` line.
_ONE_EVENT = re.compile(rb"([0-9a-fA-F]+)\r\n(data:([^\n]*)\n\n)\r\n")


def _framed(stream: Stream) -> None:
    if stream.state == HEAD:
        end = stream.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        _head(stream, stream.buf[:end])
        stream.buf = stream.buf[end + 4 :]
        stream.state = BODY
    buf, stream.buf = stream.buf, b""
    if stream.status == 200:
        return _chunks(stream, buf) if stream.chunked else _events(stream, stream.sse + buf)
    if stream.chunked:
        _dechunk(stream, buf)
    else:
        stream.sse += buf
    if 0 <= stream.length <= len(stream.sse):
        _error_answer(stream)


def _eof(stream: Stream) -> None:
    """The engine closed the connection."""
    if stream.status not in (0, 200) and stream.state == BODY:
        _error_answer(stream)
    else:
        _fail(stream, "the engine closed the stream early", Fault.UNAVAILABLE)


def _fail(stream: Stream, error: str, fault: Fault) -> None:
    if not stream.ended:
        stream.error, stream.fault, stream.ended = error, fault, True


def _head(stream: Stream, head: bytes) -> None:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    stream.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    close = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value:
            stream.chunked = True
        elif name == b"content-length" and value.isdigit():
            stream.length = int(value)
        elif name == b"connection" and b"close" in value:
            close = True
    # Kept only for a chunked answer of HTTP/1.1, read to its last chunk (`_ended`).
    stream.keep_alive = parts[0] == b"HTTP/1.1" and stream.chunked and stream.status == 200 and not close


def _dechunk(stream: Stream, buf: bytes) -> bytes:
    """The payload of the whole chunks at the start of `buf` (the rest waits in `stream.buf`); the last,
    empty chunk marks the body complete (`stream.length`)."""
    pos, out = 0, []
    while (eol := buf.find(b"\r\n", pos)) >= 0:
        size = int(buf[pos:eol].split(b";", 1)[0] or b"0", 16)
        if size == 0:
            stream.length = len(stream.sse) + sum(len(x) for x in out)
            pos = len(buf)
            break
        if len(buf) < eol + 4 + size:
            break
        out.append(buf[eol + 2 : eol + 2 + size])
        pos = eol + 4 + size
    stream.buf = buf[pos:]
    payload = b"".join(out)
    if stream.status != 200:
        stream.sse += payload
    return payload


def _chunks(stream: Stream, buf: bytes) -> None:
    """A chunked event stream: the common case (whole chunks, each one whole event) without copies."""
    payload = _dechunk(stream, buf)
    if payload:
        _events(stream, stream.sse + payload if stream.sse else payload)


def _events(stream: Stream, sse: bytes) -> None:
    """Parse the whole server-sent events in `sse`; keep a partial one for later (`stream.sse`)."""
    end = sse.rfind(b"\n")
    if end < 0:
        stream.sse = sse
        return
    stream.sse = sse[end + 1 :]
    for line in sse[:end].split(b"\n"):
        if line[:5] != b"data:" or stream.ended:
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            stream.finish, stream.ended = stream.last or "stop", True
            return
        fast = _plain_chunk(data) if stream.plain else None
        if fast is None:
            _event(stream, json.loads(data))
        else:
            stream.tokens += fast[0]
            if fast[1] is not None:
                stream.last = fast[1]


def _plain_chunk(data: bytes) -> tuple[list[int], str | None] | None:
    """The token ids and finish reason of a one-choice chunk, read without parsing the JSON; None
    when the chunk is anything else (an error, several choices, a shape not seen before).

    A key found by its bytes is the key: inside a JSON string a quote is always escaped, so
    `"token_ids":` cannot occur in a string's text. (Regular expressions, not a dozen `find`s: a
    method call is most of a small step's cost, and this runs for every token of every stream.)
    """
    if data.count(b'"token_ids":') != 1 or data.count(b'"finish_reason":') != 1 or b'"error"' in data:
        return None
    ids, finish = _TOKEN_IDS.search(data), _FINISH.search(data)
    if ids is None or finish is None:
        return None
    inner = ids[1]
    try:
        if b"," in inner:
            tokens = [int(x) for x in inner.split(b",")]
        else:
            tokens = [int(inner)] if inner.strip() else []
    except ValueError:
        return None
    reason = finish[1]
    return tokens, None if reason is None else reason.decode()


_TOKEN_IDS = re.compile(rb'"token_ids":\s*\[([^\]]*)\]')
_FINISH = re.compile(rb'"finish_reason":\s*(?:null\b|"([^"\\]*)")')


def _event(stream: Stream, chunk: dict) -> None:
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        return _fail(stream, f"engine error: {message}", Fault.REFUSED)
    for choice in chunk.get("choices") or ():
        tokens = choice.get("token_ids")
        if choice.get("finish_reason"):
            stream.last = choice["finish_reason"]
        if tokens:
            stream.tokens += tokens
            if (logprobs := choice.get("logprobs")) is not None:
                stream.logprobs.append((logprobs, len(tokens)))


def _error_answer(stream: Stream) -> None:
    """A non-200 answer, read whole: the engine's message and whose fault it is."""
    body = stream.sse
    try:
        error = json.loads(body)
        message = error.get("error", error)
        message = message.get("message", message) if isinstance(message, dict) else message
    except ValueError:
        message = body.decode(errors="replace")[:500]
    fault = Fault.UNAVAILABLE if stream.status in (502, 503, 504) else Fault.REFUSED
    _fail(stream, f"HTTP {stream.status}: {message}", fault)
