"""A daemon's link outlives connections that are reset before it takes them (a server killed as it
connected, `fsched serve --workers` replacing one): the next server still links. Real loopback sockets."""

from __future__ import annotations

import socket
import struct
import time

from fsched.core.daemon.link import LinkServer
from fsched.core.ports.link import VERSION, Hello, decode, encode


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
