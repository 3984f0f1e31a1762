"""Table: a job table as the commands and the HTTP server open it: every store over one database.

`storage.stores.JobTable` is the SQL one (SQLite or PostgreSQL, by URL);
`memory.MemoryTable` keeps the rows in the process, for tests.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fsched.core.ports.catalog import CatalogStore
from fsched.core.ports.files import FileStore
from fsched.core.ports.keys import KeyStore
from fsched.core.ports.queue import QueueStore
from fsched.core.ports.serving import ServingStore


class HeldLock(Protocol):
    """A lock this process holds until it releases it."""

    def release(self) -> None: ...


@runtime_checkable
class Table(Protocol):
    @property
    def catalog(self) -> CatalogStore: ...

    @property
    def queue(self) -> QueueStore: ...

    @property
    def keys(self) -> KeyStore: ...

    @property
    def files(self) -> FileStore: ...

    @property
    def serving(self) -> ServingStore: ...

    @property
    def sqlite(self) -> bool:
        """One SQLite file: its owner is an admin of it, and one daemon at a time serves it."""
        ...

    @property
    def display_url(self) -> str:
        """Where the table is, without a password: for logs and messages."""
        ...

    def daemon_lock(self) -> HeldLock | None:
        """Make this process the table's only daemon where only one may serve it (SQLite); None elsewhere."""
        ...

    def dispose(self) -> None:
        """Let go of the connections."""
        ...
