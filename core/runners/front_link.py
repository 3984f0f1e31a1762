"""The daemon's side of fsched's vLLM front (core/runners/vllm_front.py): every stream on one connection.

`FrontClient` has what the runner asks of an engine's client (its
description, its health, its streams); `FrontStreams` has what it asks of
the streams (`open`, `poll`, `abort`, `pause`, the wake descriptor), over
one TCP connection to the front instead of an HTTP stream each. A request
is `["add", ID, BODY]` (the token interface's body: core/runners/tokens_api.py)
and its news comes in the front's lines, an engine iteration's news for all
the daemon's requests in one line: one read and one JSON parse an iteration,
where HTTP streams cost a read and a parse a token. So a poll that found
news has the whole iteration (`whole_iterations`): the runner need not
gather the rest of it.

The connection is made (and the front greeted) at the first `open`, and
again after it is lost: losing it ends every open stream with
`Fault.UNAVAILABLE`, as an engine's restart does over HTTP; the front
aborts the requests of a connection that closes. An error the front sends
for a request (the engine refused or failed it) ends that stream with
`Fault.REFUSED`.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fsched.core.runners.openai_http import EngineHTTPError, EngineInfo
from fsched.core.runners.streams import READ_SIZE, Fault, Poller, WakeWaits, take_arrived
from fsched.core.runners.vllm_front import PROTOCOL, decode, encode
from fsched.core.stamps import stamp

SCHEME = "front"


def is_front_url(url: str) -> bool:
    return url.startswith(f"{SCHEME}://")


@dataclass(slots=True, eq=False)
class FrontStream:
    """One request's stream on the front's connection: what arrived and was not taken, how it ended."""

    id: str
    owner: object = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[tuple[dict, int]] = field(default_factory=list)  # (a line's logprobs object, its tokens)
    finish: str | None = None
    error: str | None = None
    fault: Fault | None = None
    plain: bool = True  # its reader wants no logprobs
    ended: bool = False
    closed: bool = False

    take = take_arrived

    def fail(self, error: str, fault: Fault) -> None:
        self.error, self.fault, self.ended = error, fault, True


class FrontClient:
    """A front at `front://HOST:PORT`."""

    def __init__(self, url: str, connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0):
        parts = urlsplit(url)
        if parts.scheme != SCHEME or not parts.hostname or not parts.port:
            raise ValueError(f"front URL {url!r}: write {SCHEME}://HOST:PORT")
        self.host, self.port = parts.hostname, parts.port
        self.url = f"{SCHEME}://{self.host}:{self.port}"
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s

    def greet(self) -> tuple[socket.socket, dict, bytes]:
        """A connection to the front, greeted: (its socket, the front's greeting, bytes read past it)."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except OSError as exc:
            raise EngineHTTPError(f"{self.url} unreachable: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(encode({"hello": PROTOCOL}))
            buf = b""
            while b"\n" not in buf:
                data = sock.recv(READ_SIZE)
                if not data:
                    raise EngineHTTPError(f"{self.url} closed the connection before greeting")
                buf += data
            line, _, rest = buf.partition(b"\n")
            greeting = decode(line)
        except (OSError, ValueError) as exc:
            sock.close()
            raise EngineHTTPError(f"{self.url} did not greet: {exc}") from None
        except EngineHTTPError:
            sock.close()
            raise
        if not isinstance(greeting, dict) or greeting.get("protocol") != PROTOCOL:
            sock.close()
            error = greeting.get("error") if isinstance(greeting, dict) else None
            raise EngineHTTPError(f"{self.url} is not a front this daemon can use: "
                                  f"{error or str(greeting)[:200]}")
        return sock, greeting, rest

    def healthy(self) -> bool:
        try:
            sock, _, _ = self.greet()
        except EngineHTTPError:
            return False
        sock.close()
        return True

    def info(self) -> EngineInfo:
        sock, greeting, _ = self.greet()
        sock.close()
        return EngineInfo(model=str(greeting.get("model") or "unknown"),
                          max_model_len=greeting.get("max_model_len"), kv_tokens=greeting.get("kv_tokens"),
                          max_num_seqs=greeting.get("max_num_seqs"))

    def streams(self, path: str = "") -> FrontStreams:
        return FrontStreams(self)


class FrontStreams(WakeWaits):
    """Every stream of one reader on one connection to the front."""

    whole_iterations = True  # a poll that finds news has the engine iteration's news for every stream

    def __init__(self, client: FrontClient):
        self.client = client
        self._sock: socket.socket | None = None
        self._poller: Poller | None = None
        self._open: dict[str, FrontStream] = {}
        self._out = b""  # to send, not sent yet
        self._buf = b""  # received, not a whole line yet
        self._ids = 0
        self._last_read = 0.0
        self._front_error: str | None = None
        self._ended: list[FrontStream] = []  # ended by a lost connection: the next poll's news

    def _watch_wake(self, fd: int) -> None:
        if self._poller is not None:  # else registered when the connection is made
            self._poller.register(fd, select.POLLIN)

    def __len__(self) -> int:
        return len(self._open)

    def open(self, body: dict, owner: object = None, plain: bool | None = None) -> FrontStream:
        self._ids += 1
        if plain is None:
            plain = body["sampling_params"].get("logprobs") is None
        stream = FrontStream(str(self._ids), owner, plain=plain)
        if self._sock is None:
            try:
                self._connect()
            except EngineHTTPError as exc:
                stream.fail(str(exc), Fault.UNAVAILABLE)
                stream.closed = True
                return stream
        self._open[stream.id] = stream
        self._send(encode(["add", stream.id, {"token_ids": body["token_ids"],
                                              "sampling_params": body["sampling_params"]}]))
        stamp("sent", getattr(getattr(owner, "request", None), "job_id", 0))
        return stream

    def abort(self, stream: FrontStream) -> None:
        if stream.closed:
            return
        stream.closed = True
        if self._open.pop(stream.id, None) is not None and not stream.ended and self._sock is not None:
            self._send(encode(["abort", stream.id]))

    def close(self) -> None:
        for stream in list(self._open.values()):
            stream.closed = True
        self._open.clear()
        self._drop()

    def poll(self, timeout: float) -> list[FrontStream]:
        """Read what has arrived, waiting up to `timeout` s for something; the streams with news."""
        self.woken = False
        news, self._ended = self._ended, []
        if news:
            timeout = 0.0
        if self._poller is None:
            if self._wake_poller is not None:
                self.woken = bool(self._wake_poller.poll(max(0.0, timeout)))
            elif timeout > 0:
                time.sleep(timeout)
            return news
        for fd, mask in self._poller.poll(max(0.0, timeout)):
            if fd == self._wake_fd:
                self.woken = True
            elif mask & select.POLLOUT and self._out:
                self._flush()
            elif mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                self._read(news)
        if self._open and self._sock is not None:
            now = time.monotonic()
            if now - self._last_read > self.client.read_timeout_s:
                self._lost(f"TimeoutError: nothing from {self.client.url} in "
                           f"{self.client.read_timeout_s:.0f} s")
        news += self._ended
        self._ended = []
        return news

    # -- the connection ------------------------------------------------------------------------------
    def _connect(self) -> None:
        sock, _, rest = self.client.greet()
        sock.setblocking(False)
        self._sock, self._buf, self._out, self._front_error = sock, rest, b"", None
        self._last_read = time.monotonic()
        self._poller = Poller()
        self._poller.register(sock.fileno(), select.POLLIN)
        if self._wake_fd is not None:
            self._poller.register(self._wake_fd, select.POLLIN)

    def _send(self, data: bytes) -> None:
        self._out += data
        if len(self._out) == len(data):  # nothing was waiting before it
            self._flush()

    def _flush(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lost(f"the front's connection failed: {exc}")
            return
        self._out = self._out[sent:]
        self._poller.modify(self._sock.fileno(), select.POLLIN | (select.POLLOUT if self._out else 0))

    def _read(self, news: list[FrontStream]) -> None:
        try:
            data = self._sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(f"the connection to {self.client.url} failed: {exc}")
            return
        if not data:
            self._lost(f"{self.client.url} closed the connection"
                       + (f": {self._front_error}" if self._front_error else ""))
            return
        self._last_read = time.monotonic()
        buf = self._buf + data
        if b"\n" not in data:
            self._buf = buf
            return
        *lines, self._buf = buf.split(b"\n")
        streams = self._open
        for line in lines:
            try:
                entries = decode(line)
            except ValueError:
                self._lost(f"{self.client.url} sent a line that is not the front's: {line[:80]!r}")
                return
            if isinstance(entries, dict):  # the front's own error: it closes the connection next
                self._front_error = str(entries.get("error"))
                continue
            for rid, tokens, finish, logprobs, error in entries:
                stream = streams.get(rid)
                if stream is None:
                    continue  # aborted meanwhile
                if tokens:
                    stream.tokens += tokens
                    if logprobs is not None and not stream.plain:
                        stream.logprobs.append((logprobs, len(tokens)))
                if error is not None:
                    stream.fail(error, Fault.REFUSED)
                elif finish is not None:
                    stream.finish, stream.ended = finish, True
                if stream.ended:
                    del streams[rid]
                    stream.closed = True
                if not news or news[-1] is not stream:
                    news.append(stream)

    def _lost(self, error: str) -> None:
        """The connection is gone: every open stream ends (the next poll brings them, wherever the loss
        was found: a send in `open` or `abort` too), to be opened again once the front is back."""
        for stream in self._open.values():
            stream.fail(error, Fault.UNAVAILABLE)
            stream.closed = True
            self._ended.append(stream)
        self._open.clear()
        self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._poller, self._out, self._buf = None, None, b"", b""
