"""A daemon link between two versions of fsched is refused at once, loudly, by either end, over a real
loopback socket: the server then serves from the table (nothing is misread, nothing waits on pushes)."""

from __future__ import annotations

import asyncio
import logging
import socket

from fsched.api.hub import ProgressHub
from fsched.api.link import LinkClient
from fsched.core.daemon.link import LinkServer
from fsched.core.ports.link import VERSION, Hello, Steps, StepText, Wake, Watch, decode, encode
from tests.support.dials import dials_waiting


def _closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """What the peer sent before it closed the connection (fails if it stays open)."""
    sock.settimeout(timeout)
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


def test_the_daemon_refuses_a_server_of_another_version_and_tells_it_its_own(caplog):
    server = LinkServer("127.0.0.1", 0)
    port = int(server.address.rpartition(":")[2])
    try:
        with caplog.at_level(logging.ERROR, logger="fsched.daemon"), \
                socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(encode([Hello(VERSION + 1), Wake(), Watch(7)]))
            said = _closed_by_peer(sock)
        assert [decode(line) for line in said.splitlines()] == [Hello(VERSION)]
        assert server.watcher(7) is None and not server.take_wake()  # nothing it asked for was taken
        assert f"speaks link version {VERSION + 1}, this end {VERSION}; the link is refused" in caplog.text
    finally:
        server.close()


def test_the_daemon_refuses_a_server_that_predates_versions(caplog):
    server = LinkServer("127.0.0.1", 0)
    port = int(server.address.rpartition(":")[2])
    try:
        with caplog.at_level(logging.ERROR, logger="fsched.daemon"), \
                socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b'{"op": "watch", "job": 7}\n')  # the link's first lines, before versions
            _closed_by_peer(sock)
        assert server.watcher(7) is None and not server.take_wake()
        assert "did not open with a hello: it speaks no link version" in caplog.text
    finally:
        server.close()


def test_the_server_refuses_a_daemon_of_another_version_and_reads_the_table_instead(caplog):
    """A stand-in daemon answers the hello with another version, then pushes text: the server drops the
    link, logs both versions, never shows that text, and does not dial the daemon again at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    listener.settimeout(5)

    async def run() -> tuple[list, int, list]:
        hub = ProgressHub(lambda ids: {}, interval_s=0.01)  # the table: empty, and not polled here
        client = LinkClient(hub, refresh_s=0.05)
        shown: list[str] = []

        async def reader() -> None:  # a handler waiting on job 7: only a push could show it anything
            async for choices in hub.watch(7):
                shown.append(choices[0].output_text)

        watching = asyncio.create_task(reader())

        async def addresses() -> set[str]:
            return {address}

        runner = asyncio.create_task(client.run(addresses))
        conn, _ = await asyncio.to_thread(listener.accept)
        heard = await asyncio.to_thread(conn.recv, 4096)
        conn.sendall(encode([Hello(VERSION + 1), Steps([StepText(7, "r", 0, "misread", 1, (1.0, 0.5))])]))
        client.announce(7, linkable=True)
        await asyncio.sleep(0.5)  # ten refresh periods: a retry would dial again
        dialled_again = dials_waiting(listener)
        runner.cancel()
        watching.cancel()
        conn.close()
        return [decode(line) for line in heard.splitlines()], dialled_again, shown

    try:
        with caplog.at_level(logging.ERROR, logger="fsched.serve"):
            heard, dialled_again, shown = asyncio.run(run())
    finally:
        listener.close()
    assert heard[0] == Hello(VERSION)  # the server spoke first, with its version
    assert f"the daemon at {address} speaks link version {VERSION + 1}, this end {VERSION}" in caplog.text
    assert "reads its requests from the table" in caplog.text
    assert dialled_again == 0
    assert shown == []  # the refused daemon's push never reached a reader
