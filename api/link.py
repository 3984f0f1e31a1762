"""The server's side of the daemons' links (core/daemon/link.py says what travels).

Every `refresh_s` the server connects to each live daemon's link address
(from its heartbeat) and drops links of daemons gone. A new online request
is announced on every link: a claim (the daemon that can take it claims at
once, even while it waits for its engine's tokens) or, where the text alone
answers it, a watch (a claim too; the daemon holding it pushes its text each
step). Pushed progress goes to the hub; a link that
closes sends its jobs back to table polling. Nothing here is the record: the
table is, and a server without links (none reachable, `--link off` daemons)
serves from the table alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fsched.api.hub import ProgressHub
from fsched.core.ports.records import RequestProgress
from fsched.core.types import RequestState

log = logging.getLogger("fsched.serve")

REFRESH_S = 0.5
CONNECT_TIMEOUT_S = 1.0


@dataclass(slots=True, eq=False)
class _Peer:
    address: str
    writer: asyncio.StreamWriter
    task: asyncio.Task | None = None
    jobs: set[int] = field(default_factory=set)  # jobs it pushed


class LinkClient:
    def __init__(self, hub: ProgressHub, refresh_s: float = REFRESH_S):
        self.hub = hub
        self.refresh_s = refresh_s
        self._peers: dict[str, _Peer] = {}
        self._open: dict[int, bool] = {}  # announced jobs still open -> linkable
        self._text: dict[int, str] = {}  # pushed text so far, per linked job

    @property
    def linked_daemons(self) -> int:
        return len(self._peers)

    def announce(self, job_id: int, linkable: bool) -> None:
        self._open[job_id] = linkable
        if linkable and self._peers:
            self.hub.expect_push(job_id)
        for peer in self._peers.values():
            self._send(peer, [{"op": "watch", "job": job_id}] if linkable else [{"op": "claim"}])

    def closed(self, job_id: int) -> None:
        """The job's handler is done with it (answered, cancelled, gone)."""
        if self._open.pop(job_id, None):
            for peer in self._peers.values():
                self._send(peer, [{"op": "forget", "job": job_id}])
        self._text.pop(job_id, None)

    def wake(self) -> None:
        """Ask every daemon to sync now (a cancel)."""
        for peer in self._peers.values():
            self._send(peer, [{"op": "wake"}])

    async def run(self, addresses: Callable[[], Awaitable[set[str]]]) -> None:
        """Keep one link to each live daemon; runs for the server's life."""
        while True:
            try:
                wanted = await addresses()
            except Exception:  # noqa: BLE001 - the table cannot be read now: keep what is linked
                wanted = set(self._peers)
            for address in set(self._peers) - wanted:
                self._drop(self._peers[address])
            for address in wanted - set(self._peers):
                await self._connect(address)
            await asyncio.sleep(self.refresh_s)

    async def _connect(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                    CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("cannot link to the daemon at %s: %s", address, exc)
            return
        peer = self._peers[address] = _Peer(address, writer)
        self._send(peer, [{"op": "wake"}, *({"op": "watch", "job": j} for j, ok in self._open.items() if ok)])
        peer.task = asyncio.create_task(self._read(peer, reader))

    def _send(self, peer: _Peer, messages: list[dict]) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            peer.writer.write("".join(json.dumps(m, separators=(",", ":")) + "\n" for m in messages).encode())

    async def _read(self, peer: _Peer, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                self._pushed(peer, json.loads(line))
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            log.debug("the link to %s failed: %s", peer.address, exc)
        finally:
            self._drop(peer)

    def _pushed(self, peer: _Peer, message: dict) -> None:
        job_id = message["job"]
        end = message.get("end")
        if end is None:
            text = self._text.get(job_id, "")[: message["o"]] + message["t"]
            progress = _progress(job_id, message["req"], RequestState.RUNNING, text, message)
        else:
            progress = _progress(job_id, message["req"], RequestState(end["state"]), end["t"], end)
        self._text[job_id] = progress.output_text
        peer.jobs.add(job_id)
        if not self.hub.push(job_id, (progress,)):
            self.closed(job_id)

    def _drop(self, peer: _Peer) -> None:
        if self._peers.get(peer.address) is peer:
            del self._peers[peer.address]
        if peer.task is not None and peer.task is not asyncio.current_task():
            peer.task.cancel()
        with contextlib.suppress(OSError, RuntimeError):
            peer.writer.close()
        # Every open job it might have pushed goes back to table polling until a push comes.
        self.hub.unlink([j for j, ok in self._open.items() if ok])
        for job_id in peer.jobs:
            self._text.pop(job_id, None)


def _progress(job_id: int, request_id: str, state: RequestState, text: str, m: dict) -> RequestProgress:
    return RequestProgress(
        id=request_id, job_id=job_id, state=state, output_text=text, num_output_tokens=m["n"],
        enqueued_at=m["q"], first_token_at=m.get("ft"), finished_at=m.get("fin"), finish_reason=m.get("fr"),
        error=m.get("err"), prompt_tokens=m.get("pt"), model=m.get("model"),
    )
