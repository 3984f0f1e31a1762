"""The link against a dead other end, over real loopback sockets: a daemon's link outlives connections
reset before it takes them (a server killed as it connected, `fsched serve --workers` replacing one),
and a server whose hello goes unanswered drops that link and reads the table."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

from fsched.api import link as server_link
from fsched.api.hub import ProgressHub
from fsched.api.link import LinkClient
from fsched.core.daemon.link import LinkServer
from fsched.core.ports.link import VERSION, Hello, decode, encode
from fsched.core.ports.records import RequestProgress
from fsched.core.types import RequestStatus
from tests.support.dials import dials_waiting


def _reset_before_taken(port: int) -> None:
    """A connection closed with a reset (SO_LINGER 0) at once: the listener's backlog holds a dead one."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_connections_reset_before_they_are_taken_leave_the_link_serving():
    server = LinkServer("127.0.0.1", 0)
    port = int(server.address.rpartition(":")[2])
    try:
        for _ in range(3):  # a burst of them each time: some are reset before the link thread wakes
            for _ in range(20):
                _reset_before_taken(port)
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(encode([Hello(VERSION)]))
            assert decode(sock.makefile("rb").readline()) == Hello(VERSION)  # its hello answered
    finally:
        server.close()


def test_a_server_whose_hello_goes_unanswered_drops_the_link_and_reads_the_table(caplog, monkeypatch):
    """A stand-in daemon takes the link's connection and says nothing: after the hello's deadline the
    server drops the link (a job it announced meanwhile is read from the table at the table's pace again,
    not a linked job's) and does not dial that daemon again at once."""
    monkeypatch.setattr(server_link, "HELLO_TIMEOUT_S", 0.2)
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    listener.settimeout(5)
    done = (RequestProgress(id="r1", job_id=7, status=RequestStatus.FINISHED_STOPPED,
                            output_text="from the table", num_output_tokens=3, enqueued_at=0.0,
                            first_token_at=None, finished_at=None, error=None),)

    async def run() -> tuple[float, int]:
        # The table answers at once; a linked job would be read from it only every 30 s.
        hub = ProgressHub(lambda ids: {7: done} if 7 in ids else {}, interval_s=0.01, linked_poll_s=30.0)
        client = LinkClient(hub, refresh_s=0.05)

        async def addresses() -> set[str]:
            return {address}

        poller = asyncio.create_task(hub.run())
        runner = asyncio.create_task(client.run(addresses))
        conn, _ = await asyncio.to_thread(listener.accept)  # taken, never answered
        conn.settimeout(5)
        assert await asyncio.to_thread(conn.recv, 4096)  # the server's hello: its link is up on its side
        started = time.monotonic()
        client.announce(7, linkable=True)  # on the link: its daemon would push
        seen = [choices async for choices in hub.watch(7)]
        read_after = time.monotonic() - started
        await asyncio.sleep(0.5)  # ten refresh periods: a retry would dial again
        dialled_again = dials_waiting(listener)
        runner.cancel()
        poller.cancel()
        conn.close()
        assert seen[-1][0].output_text == "from the table"
        return read_after, dialled_again

    try:
        with caplog.at_level(logging.WARNING, logger="fsched.serve"):
            read_after, dialled_again = asyncio.run(run())
    finally:
        listener.close()
    assert f"the daemon at {address} did not answer the link's hello within 0.2 s" in caplog.text
    assert 0.15 < read_after < 5  # after the deadline, not the linked job's 30 s
    assert dialled_again == 0
