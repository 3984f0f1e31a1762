"""The guard that keeps tests/unit pure refuses each way out of the process, even when the code under test
swallows the refusal, and lets the harmless look-alikes through."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.support.purity import ImpurityError, PurityGuard


@pytest.fixture
def guard():
    """A second guard over this session's, watching this test alone (it refuses first)."""
    patch = pytest.MonkeyPatch()
    made = PurityGuard()
    made.install(patch)
    made.watch()
    yield made
    made.release()
    patch.undo()


def _connect():
    with socket.socket() as s:
        s.connect(("127.0.0.1", 9))


def _bind():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


@pytest.mark.parametrize("reach, named", [
    (_connect, "open a socket"),
    (_bind, "open a socket"),
    (lambda: socket.create_connection(("localhost", 9)), "resolve a host name"),
    (lambda: subprocess.run([sys.executable, "-c", "pass"]), "start a subprocess"),
    (lambda: os.system("true"), "start a subprocess"),
    (lambda: time.sleep(0.5), "sleep"),
    (lambda: asyncio.run(asyncio.sleep(0.5)), "sleep"),
    (lambda: sqlite3.connect("never.db"), "open a database (SQLite"),
], ids=["connect", "bind", "resolve", "subprocess", "system", "sleep", "asyncio-sleep", "sqlite"])
def test_each_way_out_is_refused_and_named(guard, reach, named):
    with pytest.raises(ImpurityError, match=re.escape(named)):
        reach()
    assert [named in v for v in guard.release()] == [True]


def test_a_refusal_the_code_swallows_is_still_reported(guard):
    try:
        time.sleep(1)
    except Exception:  # noqa: BLE001 - as careless code under test would
        pass
    (found,) = guard.release()
    assert "sleep (1 s)" in found and "test_purity.py" in found  # where it came from


def test_yields_and_a_socket_pair_are_not_ways_out(guard):
    time.sleep(0)
    asyncio.run(asyncio.sleep(0))  # the event loop's own self-pipe is a socket pair
    a, b = socket.socketpair()
    a.close(), b.close()
    assert guard.release() == []

