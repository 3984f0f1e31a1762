"""The server's side of the daemons' links (`core/ports/link.py` defines what travels).

Every `refresh_s` the server connects to each live daemon's link address
(from its heartbeat) and drops links of daemons gone. A link opens with both
ends' hellos: a daemon of another link version is refused, loudly (an error
in the log naming both versions), and tried again only after
`REFUSED_RETRY_S`. A new online request is announced on every link: a claim
(the daemon that can take it claims at once, even while it waits for its
engine's tokens) or, where the text alone answers it, a watch (a claim too;
the daemon holding it pushes its text each step).

Beside each link the server keeps a second connection to the daemon, its
nudge: the group commit's thread writes a claim on it the moment a group of
requests is stored (`nudge`), without waiting for the event loop, which in a
burst is busy for milliseconds with the other requests. A request whose
claim a nudge asked for is then announced with a follow (a watch that
claims nothing): a claim was asked for after its row was in, and any claim
made after that sees it. A nudge that fails closes its connection, and
announcements to that daemon claim again until the next refresh opens a
new one. Pushed progress goes to
the hub; a link that closes sends its jobs back to table polling. Nothing
here is the record: the table is, and a server without links (none
reachable, refused, `--link off` daemons) serves from the table alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fsched.api.hub import ProgressHub
from fsched.core.ports import link as wire
from fsched.core.stamps import stamp

log = logging.getLogger("fsched.serve")

REFRESH_S = 0.5
CONNECT_TIMEOUT_S = 1.0
NUDGE_TIMEOUT_S = 0.05  # a nudge the daemon's socket does not take at once: that nudge connection is closed
_NUDGE = wire.encode([wire.Claim()])
REFUSED_RETRY_S = 30.0  # a daemon of another link version: asked again this long after (a restart)
# A daemon answers a link's hello at once (its link thread, microseconds); one that has not within this
# long is not serving its link: dropped (its requests read from the table at every poll again) and asked
# again REFUSED_RETRY_S later.
HELLO_TIMEOUT_S = 5.0
# The longest line read: a step's texts for every request a server watches (1,024 streams' pieces are
# tens of KB, asyncio's default limit is 64 KiB), or an end's whole text. The daemon drops a server
# that lets 8 MiB wait unread, so this bounds nothing a daemon would send.
LINE_LIMIT = 64 * 1024 * 1024


@dataclass(slots=True, eq=False)
class _Peer:
    address: str
    writer: asyncio.StreamWriter
    task: asyncio.Task | None = None
    jobs: set[int] = field(default_factory=set)  # jobs it pushed
    outbox: list[wire.Message] = field(default_factory=list)  # sent at the end of this loop pass
    flushing: bool = False  # a write of the outbox is due at the end of this loop pass
    greeted: bool = False  # its hello, of this link version, came


class LinkClient:
    def __init__(self, hub: ProgressHub, refresh_s: float = REFRESH_S):
        self.hub = hub
        self.refresh_s = refresh_s
        self._peers: dict[str, _Peer] = {}
        self._open: dict[int, bool] = {}  # announced jobs still open -> linkable
        self._text: dict[int, str] = {}  # pushed text so far, per linked job
        self._times: dict[int, tuple] = {}  # per linked job: its (first_token_at, enqueued_at), once pushed
        self._refused: dict[str, float] = {}  # daemons of another link version -> when (monotonic)
        self._nudges: dict[str, socket.socket] = {}  # address -> its nudge connection (blocking)
        self._nudged: frozenset[str] = frozenset()  # the addresses the latest nudge reached
        self._nudge_lock = threading.Lock()

    def nudge(self) -> None:
        """Ask every linked daemon to claim now (any thread: the group commit's, as a group is stored)."""
        with self._nudge_lock:
            for address, sock in list(self._nudges.items()):
                try:
                    sock.sendall(_NUDGE)
                except OSError as exc:
                    log.debug("the nudge connection to %s failed: %s", address, exc)
                    del self._nudges[address]
                    sock.close()
            self._nudged = frozenset(self._nudges)

    def announce(self, job_id: int, linkable: bool) -> None:
        self._open[job_id] = linkable
        if linkable and self._peers:
            self.hub.expect_push(job_id)
        nudged = self._nudged  # reached by a nudge made after this job was stored: its claim is asked for
        for address, peer in self._peers.items():
            if address not in nudged:
                self._send(peer, [wire.Watch(job_id)] if linkable else [wire.Claim()])
            elif linkable:
                self._send(peer, [wire.Follow(job_id)])

    def closed(self, job_id: int) -> None:
        """The job's handler is done with it (answered, cancelled, gone). Its `Forget` waits for the
        next message that goes at once, or the next refresh: the daemon pushes nothing more of a job
        after its end, and what it pushes of one cancelled meanwhile is dropped here (a write and a
        daemon's wake-up a request fewer)."""
        if self._open.pop(job_id, None):
            for peer in self._peers.values():
                self._send(peer, [wire.Forget(job_id)], later=True)
        self.hub.unexpect(job_id)
        self._text.pop(job_id, None)
        self._times.pop(job_id, None)

    def wake(self) -> None:
        """Ask every daemon to sync now (a cancel)."""
        for peer in self._peers.values():
            self._send(peer, [wire.Wake()])

    async def run(self, addresses: Callable[[], Awaitable[set[str]]]) -> None:
        """Keep one link to each live daemon; runs for the server's life."""
        while True:
            try:
                wanted = await addresses()
            except Exception:  # noqa: BLE001 - the table cannot be read now: keep what is linked
                wanted = set(self._peers)
            for address in set(self._peers) - wanted:
                self._drop(self._peers[address])
            now = time.monotonic()
            self._refused = {a: t for a, t in self._refused.items()
                             if a in wanted and now - t < REFUSED_RETRY_S}
            for address in wanted - set(self._peers) - set(self._refused):
                await self._connect(address)
            for address in [a for a, peer in self._peers.items() if peer.greeted and a not in self._nudges]:
                await self._open_nudge(address)  # one that failed: again
            for peer in self._peers.values():
                if peer.outbox and not peer.flushing:  # the `Forget`s no other message took along
                    self._flush(peer)
            await asyncio.sleep(self.refresh_s)

    async def _connect(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            connecting = asyncio.open_connection(host, int(port), limit=LINE_LIMIT)
            reader, writer = await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("cannot link to the daemon at %s: %s", address, exc)
            return
        peer = self._peers[address] = _Peer(address, writer)
        watches = [wire.Watch(j) for j, ok in self._open.items() if ok]
        self._send(peer, [wire.Hello(wire.VERSION), wire.Wake(), *watches])
        peer.task = asyncio.create_task(self._read(peer, reader))

    async def _open_nudge(self, address: str) -> None:
        """The daemon's nudge connection, opened beside its link (a blocking socket, for any thread)."""
        host, _, port = address.rpartition(":")

        def opened() -> socket.socket:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(NUDGE_TIMEOUT_S)
                sock.sendall(wire.encode([wire.Hello(wire.VERSION)]))
            except OSError:
                sock.close()
                raise
            return sock  # the daemon's hello back is left unread: nothing else ever comes on it

        try:
            sock = await asyncio.to_thread(opened)
        except (OSError, ValueError) as exc:
            log.debug("no nudge connection to the daemon at %s: %s", address, exc)
            return
        with self._nudge_lock:
            if self._peers.get(address) is not None and address not in self._nudges:
                self._nudges[address] = sock
                return
        sock.close()

    def _close_nudge(self, address: str) -> None:
        with self._nudge_lock:
            sock = self._nudges.pop(address, None)
            if sock is not None:
                sock.close()

    def _send(self, peer: _Peer, messages: list[wire.Message], later: bool = False) -> None:
        """Queue messages; what the requests of one loop pass send (their announcements, their ends)
        goes in one write, not a system call each. `later`: they wait for the next write that goes."""
        peer.outbox += messages
        if later or peer.flushing:
            return
        peer.flushing = True
        try:
            asyncio.get_running_loop().call_soon(self._flush, peer)
        except RuntimeError:  # no loop runs (a server stopping): now
            self._flush(peer)

    @staticmethod
    def _flush(peer: _Peer) -> None:
        peer.flushing = False
        messages, peer.outbox = peer.outbox, []
        if messages:
            with contextlib.suppress(OSError, RuntimeError):
                peer.writer.write(wire.encode(messages))

    async def _read(self, peer: _Peer, reader: asyncio.StreamReader) -> None:
        try:
            hello = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            wire.greeting(hello, f"the daemon at {peer.address}")
            peer.greeted = True
            await self._open_nudge(peer.address)
            while line := await reader.readline():
                self._pushed(peer, wire.decode(line))
        except wire.LinkRefused as exc:
            self._refused[peer.address] = time.monotonic()
            log.error("%s; this server reads its requests from the table", exc)
        except TimeoutError:  # its link took the connection and answers nothing: not dialled again at once
            self._refused[peer.address] = time.monotonic()
            log.warning("the daemon at %s did not answer the link's hello within %g s; this server reads its "
                        "requests from the table", peer.address, HELLO_TIMEOUT_S)
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            log.debug("the link to %s failed: %s", peer.address, exc)
        finally:
            self._drop(peer)

    def _pushed(self, peer: _Peer, message: wire.Message) -> None:
        if isinstance(message, wire.Steps):
            self._stepped(peer, message.texts)
        elif isinstance(message, wire.End):
            self._progress(peer, message.job, message.progress())
        else:
            raise wire.LinkRefused(f"the daemon at {peer.address} sent a {message.TAG} message, which a "
                                   "daemon never sends after its hello")

    def _stepped(self, peer: _Peer, steps: list[wire.StepText]) -> None:
        """A step's texts, each request's whole text so far to the hub; its progress is made only where
        the hub needs one (most texts go to the stream's text sink as they are)."""
        texts, times, jobs, push = self._text, self._times, peer.jobs, self.hub.push_running
        for step in steps:
            job_id = step.job
            text = texts[job_id] = texts.get(job_id, "")[: step.start] + step.text
            if step.times is None:  # sent with its first texts only
                step.times = times.get(job_id)
            else:
                times[job_id] = step.times
                stamp("received", job_id)
            jobs.add(job_id)
            if not push(job_id, text, _running, step):
                self.closed(job_id)

    def _progress(self, peer: _Peer, job_id: int, progress) -> None:
        stamp("end_received", job_id)
        self._text[job_id] = progress.output_text
        peer.jobs.add(job_id)
        if not self.hub.push(job_id, (progress,)):
            self.closed(job_id)

    def _drop(self, peer: _Peer) -> None:
        if self._peers.get(peer.address) is peer:
            del self._peers[peer.address]
            self._close_nudge(peer.address)
        if peer.task is not None and peer.task is not asyncio.current_task():
            peer.task.cancel()
        with contextlib.suppress(OSError, RuntimeError):
            peer.writer.close()
        # Every open job it might have pushed goes back to table polling until a push comes.
        self.hub.unlink([j for j, ok in self._open.items() if ok])
        for job_id in peer.jobs:
            self._text.pop(job_id, None)
            self._times.pop(job_id, None)



def _running(step: wire.StepText, text: str) -> tuple:
    """The hub's choices of a pushed step: the one request's progress, `text` its whole text."""
    return (step.running(text),)
