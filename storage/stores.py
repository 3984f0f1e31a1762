"""Every store over one job table: what the commands and the HTTP server open.

The callers (cli/, api/) see the protocols of core/ports only, never a SQL
class or the database underneath: this is the one place that makes the
stores, all over one connection pool. Each store is made on first use, so a
command opens (and checks the schema for) only the sides it uses.

A `memory:NAME` URL opens the in-memory table (core/ports/memory) this
process keeps under that name: tests run the commands over it in process,
each command finding the rows the one before left.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from fsched.storage.db import MEMORY_SCHEME, DaemonLock, Database, resolve_database_url

# Each store's module is imported when the store is first made, and the in-memory table's when one is
# opened: a command loads only what it uses (a CLI command's start is mostly imports).
if TYPE_CHECKING:
    from fsched.core.ports.catalog import CatalogStore
    from fsched.core.ports.files import FileStore
    from fsched.core.ports.keys import KeyStore
    from fsched.core.ports.memory import MemoryTable
    from fsched.core.ports.queue import QueueStore
    from fsched.core.ports.serving import ServingStore
    from fsched.core.ports.table import Table


class JobTable:
    """The job table at one URL (SQLAlchemy URL or SQLite path; None: the default) and its stores."""

    def __init__(self, url: str | None = None):
        self._db = Database(url)

    @property
    def sqlite(self) -> bool:
        """One SQLite file: its owner is an admin of it, and one daemon at a time serves it."""
        return self._db.dialect == "sqlite"

    @property
    def display_url(self) -> str:
        """The URL without its password, for logs and messages."""
        return self._db.display_url

    @cached_property
    def catalog(self) -> CatalogStore:
        from fsched.storage.sql_catalog import SqlCatalogStore

        return SqlCatalogStore(self._db)

    @cached_property
    def queue(self) -> QueueStore:
        from fsched.storage.sql_queue import SqlQueueStore

        return SqlQueueStore(self._db)

    @cached_property
    def keys(self) -> KeyStore:
        from fsched.storage.sql_keys import SqlKeyStore

        return SqlKeyStore(self._db)

    @cached_property
    def files(self) -> FileStore:
        from fsched.storage.sql_files import SqlFileStore

        return SqlFileStore(self._db)

    @cached_property
    def serving(self) -> ServingStore:
        from fsched.storage.sql_serving import SqlServingStore

        return SqlServingStore(self._db)

    def daemon_lock(self) -> DaemonLock | None:
        """On SQLite, make this process the table's only daemon (None on PostgreSQL); see Database."""
        return self._db.daemon_lock()

    def dispose(self) -> None:
        """Close the connection pool."""
        self._db.dispose()


_memory_tables: dict[str, MemoryTable] = {}


def open_table(url: str | None = None) -> Table:
    """The job table at `url` (None: FSCHED_DB, else the default), its stores made as they are used; a
    `memory:NAME` URL: this process's in-memory table of that name, made on first use."""
    url = resolve_database_url(url)
    if url.startswith(MEMORY_SCHEME):
        if url not in _memory_tables:
            from fsched.core.ports.memory import MemoryTable

            # Made by this process, as an SQLite file is by the user who first opens it: its owner.
            _memory_tables[url] = MemoryTable(file_owner=os.geteuid())
        return _memory_tables[url]
    return JobTable(url)


def forget_memory_table(url: str) -> None:
    """Drop this process's in-memory table of that URL (the next open makes a new one)."""
    _memory_tables.pop(url, None)
