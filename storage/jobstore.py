"""Both sides of the job table over one Database, for code that plays commands and daemon at once.

The commands depend on `CatalogStore` and the daemon on `QueueStore`; tests,
benchmarks and tools that submit work and then serve it in one process use
this class, which is both.
"""

from __future__ import annotations

from fsched.storage.sql_catalog import SqlCatalogStore
from fsched.storage.sql_queue import SqlQueueStore


class SqlJobStore(SqlCatalogStore, SqlQueueStore):
    """The catalog and the queue sharing one connection pool and one clock."""
