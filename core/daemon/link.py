"""The daemon's link: a TCP socket where HTTP servers (`fsched serve`) hear its tokens at once.

The job table stays the record; the link only makes things fast, and losing
it loses nothing but speed. Each server connects to every live daemon's
link (the address is in the heartbeat) and sends, one JSON object a line:
- `{"op": "wake"}`: a cancel (or a server just linked): sync with the table
  now instead of at the next interval;
- `{"op": "claim"}`: new online work: claim now (only that: weights and
  cancels wait for the next sync);
- `{"op": "watch", "job": J}` / `{"op": "forget", "job": J}`: push, or stop
  pushing, the progress of job J's requests held here (a watch is new work:
  it claims too).
The daemon pushes, one line a request: `{"job", "req", "o", "t", "n", "ft", "q"}`
after each step that gave it tokens (the text from character `o` on is `t`:
a tail the tokenizer has not settled yet is sent again), and `{"job", "req",
"end": {...}}` once its completion is in the table. A linked request's
tokens go to the table in batches (the writer's batch interval), not every step.

One thread does the sockets (a selector); the daemon's loop only appends to a
connection's buffer. A server that does not read its buffer past
`MAX_BUFFER` bytes is dropped (it falls back to reading the table).
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import selectors
import socket
import threading
from dataclasses import dataclass, field

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

    def send(self, lines: dict[object, list[dict]]) -> None:
        """Queue each connection's lines; the link thread writes them (ASCII JSON: any text, lone
        surrogates included, goes through as escapes)."""
        if not lines:
            return
        with self._lock:
            for conn, messages in lines.items():
                if conn not in self._conns.values():
                    continue
                conn.out += "".join(json.dumps(m, separators=(",", ":")) + "\n"
                                    for m in messages).encode()
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
        with contextlib.suppress(BlockingIOError):
            sock, _ = self._listener.accept()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
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
        except (OSError, ValueError) as exc:
            log.debug("link connection dropped: %s", exc)
            self._drop(conn)

    def _read_lines(self, conn: _Conn) -> None:
        *lines, rest = conn.inbox.split(b"\n")
        conn.inbox = bytearray(rest)
        for line in lines:
            message = json.loads(line)
            op, job = message.get("op"), message.get("job")
            with self._lock:
                if op == "watch" and isinstance(job, int):
                    conn.jobs.add(job)
                    self._watchers[job] = conn
                elif op == "forget" and isinstance(job, int):
                    conn.jobs.discard(job)
                    if self._watchers.get(job) is conn:
                        del self._watchers[job]
                if op not in ("wake", "claim", "watch"):
                    continue
                first = not self._wants  # one byte a wake-up: the descriptor is readable until taken
                if op == "wake":
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
