"""MemoryTable: every store over one set of rows in memory, as `storage.stores.JobTable` is over one URL.

What a unit test opens where the commands and the HTTP server open the SQL
table: a request the catalog stores is claimable through the queue, and the
tokens the queue writes back show in the catalog's results and the serving
reads. Nothing is kept when the process ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fsched.core.ports.memory.catalog import MemoryCatalogStore
from fsched.core.ports.memory.files import MemoryFileStore
from fsched.core.ports.memory.keys import MemoryKeyStore
from fsched.core.ports.memory.queue import MemoryQueueStore
from fsched.core.ports.memory.rows import MemoryRows
from fsched.core.ports.memory.serving import MemoryServingStore


class MemoryTable:
    """The stores over one `MemoryRows` on `clock`; `file_owner` plays the OS user owning a table's file
    (its admin; None: no file, as on PostgreSQL)."""

    sqlite = False  # no file: no owner-admin, any number of daemons
    display_url = "memory:"

    def __init__(self, clock: Callable[[], float] = time.time, file_owner: int | None = None):
        self.rows = MemoryRows(clock, file_owner)
        self.catalog = MemoryCatalogStore(self.rows)
        self.queue = MemoryQueueStore(rows=self.rows)
        self.keys = MemoryKeyStore(self.rows)
        self.files = MemoryFileStore(self.rows)
        self.serving = MemoryServingStore(self.rows)

    def daemon_lock(self) -> None:
        """No file to lock: daemons share the rows under leases."""
        return None

    def dispose(self) -> None:
        """Nothing to close."""
