"""The daemon's link: a TCP socket where HTTP servers (`fsched serve`) hear its tokens at once.

The job table stays the record; the link only makes things fast, and losing
it loses nothing but speed. Each server connects to every live daemon's
link (the address is in the heartbeat). What travels, both ways, is the
typed messages of `core/ports/link.py`, the server's end (`api/link.py`)
reading and writing the same ones: a server opens with its hello (a server
of another link version is refused, loudly, and disconnected), then asks
for a sync (`Wake`: a cancel, or a server just linked), a claim (`Claim`:
new online work; weights and cancels wait for the next sync), or pushes of
a job's progress (`Watch` / `Forget`; a watch is new work and claims too;
`Follow` watches only: its claim came on the server's nudge connection, a
second link that carries nothing but claims, written by the server's group
commit thread as each group of requests is stored).
The daemon pushes each step's texts of watched requests (`Steps`) and their ends
(`End`), from `core/daemon/publish.py`.
A linked request's tokens go to the table in batches (the writer's batch
interval), not every step.

One thread does the sockets (a selector); the daemon's loop only appends to a
connection's buffer. A server that does not read its buffer past
`MAX_BUFFER` bytes is dropped (it falls back to reading the table).
"""

from __future__ import annotations

import contextlib
import logging
import select
import selectors
import socket
import threading
from dataclasses import dataclass, field

from fsched.core.ports import link as wire
from fsched.core.stamps import stamp

log = logging.getLogger("fsched.daemon")

MAX_BUFFER = 8 * 1024 * 1024


@dataclass(slots=True)
class Wants:
    """What servers asked of the daemon since it last looked."""

    sync: bool = False  # weights, cancels and new work
    claim: bool = False  # new work only

    def __bool__(self) -> bool:
        return self.sync or self.claim


@dataclass(slots=True, eq=False)
class _Conn:
    sock: socket.socket
    peer: str  # for the log
    greeted: bool = False  # its hello, of this link version, came
    inbox: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    jobs: set[int] = field(default_factory=set)


class LinkServer:
    """The sockets side: connections, the jobs each watches, wake-ups. Thread-safe."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, advertise: str | None = None):
        self._listener = socket.create_server((host, port))
        self._listener.setblocking(False)
        bound = self._listener.getsockname()
        self.address = f"{advertise or bound[0]}:{bound[1]}"
        self._lock = threading.Lock()
        self._watchers: dict[int, _Conn] = {}
        self._conns: dict[socket.socket, _Conn] = {}
        self._wants = Wants()
        # Readable while a wake-up waits: a daemon blocked on its engine's streams polls it too.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poke_r, self._poke_w = socket.socketpair()
        self._poke_r.setblocking(False)
        self._poke_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._poke_r, selectors.EVENT_READ, "poke")
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fsched-link", daemon=True)
        self._thread.start()

    # -- the daemon loop's side ------------------------------------------------------
    @property
    def wake_fd(self) -> int:
        """A descriptor readable while a wake-up waits for `take_wake`."""
        return self._wake_r.fileno()

    def wait(self, timeout: float) -> None:
        """Sleep up to `timeout`, less if a server asks for a sync or a claim."""
        select.select([self._wake_r], [], [], timeout)

    def take_wake(self) -> Wants:
        """What servers asked for since the last call."""
        with self._lock:
            wants, self._wants = self._wants, Wants()
            if not wants:
                return wants
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        return wants

    def watcher(self, job_id: int) -> object | None:
        """The connection that watches the job, if any (a handle for `send`)."""
        return self._watchers.get(job_id)

    def send(self, lines: dict[object, list[wire.Message]]) -> None:
        """Queue each connection's messages; the link thread writes them."""
        if not lines:
            return
        queued = False
        with self._lock:
            for conn, messages in lines.items():
                if conn not in self._conns.values():
                    continue
                data = wire.encode(messages)
                if not conn.out:
                    # Nothing queued before it: written here at once, a system call a step, rather
                    # than waking the link thread for it (a switch of threads and a select a step).
                    # What the socket does not take, and any error, is the link thread's.
                    with contextlib.suppress(OSError):
                        data = data[conn.sock.send(data):]
                if data:
                    conn.out += data
                    queued = True
        if queued:
            with contextlib.suppress(BlockingIOError):
                self._poke_w.send(b"x")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._poke_w.send(b"x")
        self._thread.join(timeout=2)

    # -- the link thread -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed:
            with self._lock:
                for conn in self._conns.values():
                    mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
                    self._selector.modify(conn.sock, mask, conn)
            for key, mask in self._selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "poke":
                    with contextlib.suppress(BlockingIOError):
                        self._poke_r.recv(4096)
                else:
                    self._io(key.data, mask)
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._listener.close()
        for sock in (self._wake_r, self._wake_w, self._poke_r, self._poke_w):
            sock.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            host, port = sock.getpeername()[:2]
        except OSError as exc:  # reset before it was taken (a server killed as it connected): not one
            log.debug("link connection dropped before it was taken: %s", exc)
            sock.close()
            return
        conn = _Conn(sock, f"a server at {host}:{port}")
        with self._lock:
            self._conns[sock] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _io(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ:
                data = conn.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                conn.inbox += data
                self._read_lines(conn)
            if mask & selectors.EVENT_WRITE:
                with self._lock:
                    sent = conn.sock.send(conn.out)
                    del conn.out[:sent]
                    if len(conn.out) > MAX_BUFFER:
                        raise ConnectionError("the server does not read its link")
        except BlockingIOError:
            pass
        except wire.LinkRefused as exc:
            log.error("%s", exc)
            self._drop(conn)
        except (OSError, ValueError) as exc:
            log.debug("link connection dropped: %s", exc)
            self._drop(conn)

    def _read_lines(self, conn: _Conn) -> None:
        *lines, rest = conn.inbox.split(b"\n")
        conn.inbox = bytearray(rest)
        for line in lines:
            if not conn.greeted:
                self._greet(conn, line)
                continue
            self._take(conn, wire.decode(line))

    def _greet(self, conn: _Conn, line: bytes) -> None:
        """The server's hello answered with ours; LinkRefused for another link version, or none (a
        server older than versions), after telling it ours (its log then says both)."""
        try:
            wire.greeting(line, conn.peer)
        except wire.LinkRefused:
            with contextlib.suppress(OSError):
                conn.sock.send(wire.encode([wire.Hello(wire.VERSION)]))
            raise
        conn.greeted = True
        with self._lock:
            conn.out += wire.encode([wire.Hello(wire.VERSION)])

    def _take(self, conn: _Conn, message: wire.Message) -> None:
        with self._lock:
            if isinstance(message, wire.Watch | wire.Follow):
                conn.jobs.add(message.job)
                self._watchers[message.job] = conn
                stamp("announced", message.job)
                if isinstance(message, wire.Follow):  # its claim was asked for on the server's nudge
                    return
            elif isinstance(message, wire.Forget):
                conn.jobs.discard(message.job)
                if self._watchers.get(message.job) is conn:
                    del self._watchers[message.job]
                return
            elif isinstance(message, wire.Steps | wire.End | wire.Hello):
                raise wire.LinkRefused(f"{conn.peer} sent a {message.TAG} message, which a server never "
                                       "sends after its hello")
            first = not self._wants  # one byte a wake-up: the descriptor is readable until taken
            if isinstance(message, wire.Wake):
                self._wants.sync = True
            else:
                self._wants.claim = True
            if first:
                with contextlib.suppress(BlockingIOError):
                    self._wake_w.send(b"x")

    def _drop(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.pop(conn.sock, None)
            for job in conn.jobs:
                if self._watchers.get(job) is conn:
                    del self._watchers[job]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()
