"""Ports for the servers tests start, picked below the kernel's ephemeral range.

A port the kernel hands out for binding port 0 comes from the same range as the source ports of
outgoing connections: between the pick and the server's own bind, a client socket (a database
connection, an HTTP request of another test) can take it, and the server fails to start. Below
that range only an explicit bind takes a port. Each xdist worker picks from its own slice, and a
process never hands out one port twice, so two servers of one run never race for a port.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_FLOOR = 20_000  # above the well-known services a developer's machine may run
_handed: set[int] = set()
_rng = random.Random()  # its own: a test's seeded global random stays untouched


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; macOS's range starts at 49152


def _worker_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    index = int(worker) if worker.isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    width = (_ephemeral_start() - _FLOOR) // count
    return range(_FLOOR + (index % count) * width, _FLOOR + (index % count + 1) * width)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to now, outside the ephemeral range where it can."""
    span = _worker_slice()
    if len(span) < 100:  # an ephemeral range reaching down to the floor: the kernel's pick it is
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    start = _rng.randrange(len(span))
    for i in range(len(span)):
        port = span[(start + i) % len(span)]
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # bound, or lingering in TIME_WAIT
        _handed.add(port)
        return port
    raise RuntimeError(f"no free port in {span.start}-{span.stop - 1}")
