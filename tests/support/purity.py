"""What keeps tests/unit pure: no sockets, subprocesses, sleeps or databases.

`PurityGuard` wraps the few entry points through which a test reaches the world outside its process
(or waits on the wall clock) once per test session. While a unit test runs, a call through one of
them is recorded as a violation and raises `ImpurityError`; the test fails even when the code under
test swallows the error. Outside a unit test (an integration file run by the same worker) and in
threads that were already running when the test began, the wrapped functions behave as before.
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import sqlite3
import subprocess
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# A sleep this short (or zero: "let others run") is a yield, not a wait on the wall clock.
SLEEP_TOLERANCE_S = 0.005


class ImpurityError(AssertionError):
    """A unit test reached outside its process or waited on the wall clock."""


@dataclass
class PurityGuard:
    """Installed once per session; `watch` and `release` bracket each unit test."""

    installed: bool = False
    active: bool = False
    violations: list[str] = field(default_factory=list)
    _foreign_threads: frozenset[int] = frozenset()

    def install(self, patch: pytest.MonkeyPatch) -> None:
        # The standard library asks `uname -p` once per process for the platform's name (the openai
        # SDK's headers want it): a fact of the interpreter, learnt here rather than in a test.
        platform.platform()
        for owner, name, what in _ENTRY_POINTS:
            patch.setattr(owner, name, self._wrap(getattr(owner, name), what))
        patch.setattr(time, "sleep", self._wrap_sleep(time.sleep))
        patch.setattr(asyncio, "sleep", self._wrap_async_sleep(asyncio.sleep))
        patch.setattr(sqlite3, "connect", self._wrap_sqlite(sqlite3.connect))
        self.installed = True

    def watch(self) -> None:
        main = threading.main_thread().ident
        self._foreign_threads = frozenset(t.ident for t in threading.enumerate() if t.ident != main)
        self.violations = []
        self.active = True

    def release(self) -> list[str]:
        self.active = False
        found, self.violations = self.violations, []
        return found

    def _watching(self) -> bool:
        return self.active and threading.get_ident() not in self._foreign_threads

    def _refuse(self, what: str) -> None:
        message = (f"a unit test must not {what} (from {_caller()}): move the test to tests/integration "
                   "or fake it")
        self.violations.append(message)
        raise ImpurityError(message)

    def _wrap(self, original: Callable, what: str) -> Callable:
        def guarded(*args, **kwargs):
            if self._watching():
                self._refuse(what)
            return original(*args, **kwargs)

        return guarded

    def _wrap_sleep(self, original: Callable) -> Callable:
        def sleep(seconds: float) -> None:
            if self._watching() and seconds > SLEEP_TOLERANCE_S:
                self._refuse(f"sleep ({seconds} s)")
            original(seconds)

        return sleep

    def _wrap_async_sleep(self, original: Callable) -> Callable:
        async def sleep(delay: float, result=None):
            if self._watching() and delay > SLEEP_TOLERANCE_S:
                self._refuse(f"sleep ({delay} s, asyncio)")
            return await original(delay, result)

        return sleep

    def _wrap_sqlite(self, original: Callable) -> Callable:
        def connect(database, *args, **kwargs):
            if self._watching():
                self._refuse(f"open a database (SQLite {database!r})")
            return original(database, *args, **kwargs)

        return connect


def _caller() -> str:
    """The innermost frames that are not the guard's or the standard library's."""
    frames = [f for f in traceback.extract_stack()[:-3] if not _is_library(f.filename)]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-3:]))


def _is_library(filename: str) -> bool:
    return (filename == __file__ or filename.startswith((_STDLIB, "<")) or "site-packages" in filename)


_STDLIB = sysconfig.get_paths()["stdlib"]


def _psycopg_entry_points() -> list[tuple[object, str, str]]:
    try:
        import psycopg
    except ImportError:  # the PostgreSQL driver is optional
        return []
    what = "open a database (PostgreSQL)"
    return [(psycopg, "connect", what), (psycopg.Connection, "connect", what),
            (psycopg.AsyncConnection, "connect", what)]


# asyncio's own self-pipe is a socketpair, which binds and connects nothing: it stays allowed.
_ENTRY_POINTS: list[tuple[object, str, str]] = [
    (socket.socket, "connect", "open a socket (connect)"),
    (socket.socket, "connect_ex", "open a socket (connect)"),
    (socket.socket, "bind", "open a socket (bind)"),
    (socket, "getaddrinfo", "resolve a host name"),
    (subprocess.Popen, "__init__", "start a subprocess"),
    (os, "system", "start a subprocess (os.system)"),
    (os, "fork", "fork the process"),
    (os, "posix_spawn", "start a subprocess (posix_spawn)"),
    (os, "posix_spawnp", "start a subprocess (posix_spawnp)"),
    *_psycopg_entry_points(),
]
