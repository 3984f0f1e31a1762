"""What both SQL stores are built on: one Database, one clock for the times they stamp."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from sqlalchemy.engine import make_url

from fsched.storage.db import Database
from fsched.storage.schema import ensure_schema


class SqlStoreBase:
    """Opens (or shares) a Database and makes sure its schema is current.

    Pass one store's `db` to the other to have both sides of the store over
    one connection pool.
    """

    def __init__(self, db: Database | str | None = None, clock: Callable[[], float] = time.time):
        self.db = db if isinstance(db, Database) else Database(db)
        self.clock = clock
        ensure_schema(self.db)

    def file_owner(self) -> int | None:
        """The OS user id that owns the SQLite file (an fsched admin of it); None on PostgreSQL."""
        if self.db.dialect != "sqlite":
            return None
        return os.stat(make_url(self.db.url).database).st_uid
