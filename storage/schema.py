"""Schema versions and migrations: a small numbered scheme, not Alembic.

Why not Alembic: fsched's schema is a handful of tables owned by one
program, migrated by the program itself when it opens the database (users
never run a separate migration tool), on two backends. A numbered list of
steps, applied in one write transaction under a lock, needs no extra
dependency, no migration folder to package, and is tested like any code.

- A new database gets the current models (`create_all`) and the current
  version number.
- An older database runs `MIGRATIONS[v]` for each version v it lacks, each a
  function of a Connection written against the schema as it was.
- A newer database (written by a later fsched) is refused, not guessed at.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, inspect, select, text

from fsched.core.ports.records import SchemaMismatch
from fsched.storage.db import Database
from fsched.storage.models import Base, Meta

SCHEMA_VERSION = 5
VERSION_KEY = "schema_version"

Migration = Callable[[Connection], None]


def _v1_to_v2(conn: Connection) -> None:
    """Cluster usage per daemon (was one unused row per tenant); an index for the lease sweep."""
    conn.execute(text("DROP TABLE IF EXISTS tenant_usage"))
    Base.metadata.tables["daemon_usage"].create(conn)
    for index in Base.metadata.tables["requests"].indexes:
        if index.name == "ix_requests_state_lease_expires":
            index.create(conn)


def _v2_to_v3(conn: Connection) -> None:
    """The HTTP server's tables: API keys, Batch API files and batches."""
    for name in ("api_keys", "files", "batches"):
        Base.metadata.tables[name].create(conn, checkfirst=True)


def _v3_to_v4(conn: Connection) -> None:
    """Logprobs of the output tokens, written with them (NULL for the requests that asked none)."""
    if "output_logprobs" in {c["name"] for c in inspect(conn).get_columns("requests")}:
        return  # an older database made by create_all of these models (as tests make them)
    column = Base.metadata.tables["requests"].c.output_logprobs
    kind = column.type.compile(dialect=conn.dialect)
    conn.execute(text(f"ALTER TABLE requests ADD COLUMN output_logprobs {kind}"))


def _v4_to_v5(conn: Connection) -> None:
    """Several choices a line (one row each, `choice`), and the answer's options (`answer`).

    The uniqueness of a custom_id within a job becomes that of (custom_id,
    choice). PostgreSQL swaps the constraint; SQLite cannot drop one, so the
    table is rebuilt: renamed, made again from the models, copied, dropped.
    """
    if "choice" in {c["name"] for c in inspect(conn).get_columns("requests")}:
        return  # made by create_all of these models
    if conn.dialect.name == "postgresql":
        answer = Base.metadata.tables["requests"].c.answer.type.compile(dialect=conn.dialect)
        conn.execute(text("ALTER TABLE requests ADD COLUMN choice INTEGER NOT NULL DEFAULT 0"))
        conn.execute(text(f"ALTER TABLE requests ADD COLUMN answer {answer}"))
        conn.execute(text("ALTER TABLE requests DROP CONSTRAINT uq_requests_job_custom_id"))
        conn.execute(text("ALTER TABLE requests ADD CONSTRAINT uq_requests_job_custom_id_choice "
                          "UNIQUE (job_id, custom_id, choice)"))
        return
    columns = ", ".join(c["name"] for c in inspect(conn).get_columns("requests"))
    conn.execute(text("ALTER TABLE requests RENAME TO requests_v4"))
    for index in inspect(conn).get_indexes("requests_v4"):
        conn.execute(text(f'DROP INDEX "{index["name"]}"'))
    Base.metadata.tables["requests"].create(conn)
    conn.execute(text(f"INSERT INTO requests ({columns}) SELECT {columns} FROM requests_v4"))
    conn.execute(text("DROP TABLE requests_v4"))


# MIGRATIONS[v] upgrades a database from version v to v + 1.
MIGRATIONS: dict[int, Migration] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5}


def ensure_schema(
    db: Database,
    version: int = SCHEMA_VERSION,
    migrations: dict[int, Migration] | None = None,
) -> int:
    """Create or upgrade the schema; return the version found before."""
    migrations = MIGRATIONS if migrations is None else migrations
    if _read_version(db) == version:
        return version  # the common case: no write lock taken
    with db.write() as conn:
        if db.dialect == "postgresql":
            # Several daemons may start at once; one migrates, the others wait.
            conn.execute(text("SELECT pg_advisory_xact_lock(727001)"))
        found = _version_in(conn)
        if found is None:
            Base.metadata.create_all(conn)
            _store_version(conn, version, insert=True)
            return 0
        if found > version:
            raise SchemaMismatch(
                f"database {db.display_url} has schema version {found}, newer than this "
                f"fsched understands ({version}); upgrade fsched"
            )
        for step in range(found, version):
            if step not in migrations:
                raise SchemaMismatch(f"no migration from schema version {step} to {step + 1}")
            migrations[step](conn)
        _store_version(conn, version, insert=False)
        return found


def _read_version(db: Database) -> int | None:
    with db.read() as conn:
        return _version_in(conn)


def _version_in(conn: Connection) -> int | None:
    if not inspect(conn).has_table(Meta.__tablename__):
        return None
    value = conn.execute(select(Meta.value).where(Meta.key == VERSION_KEY)).scalar_one_or_none()
    return None if value is None else int(value)


def _store_version(conn: Connection, version: int, insert: bool) -> None:
    table = Meta.__table__
    if insert:
        conn.execute(table.insert().values(key=VERSION_KEY, value=str(version)))
    else:
        conn.execute(table.update().where(table.c.key == VERSION_KEY).values(value=str(version)))
