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

import json
import sqlite3
from collections.abc import Callable

from sqlalchemy import JSON, Connection, inspect, select, text

from fsched.core.ports.records import SchemaMismatch
from fsched.storage import changes
from fsched.storage.db import Database
from fsched.storage.models import Base, Meta

SCHEMA_VERSION = 14
VERSION_KEY = "schema_version"
CHUNKED_FILES_VERSION = 8  # from it on, SQLite files vacuum incrementally (storage.db.reclaim_space)
# Creating or migrating the schema is one transaction of many statements with the client's work between
# them (SQLAlchemy inspects before each CREATE): on a loaded machine a pause between two can pass the
# short idle limit every connection has (storage.db.PG_IDLE_IN_TRANSACTION_MS), and the server would end
# the session mid-way. This transaction alone gets a generous limit; it holds no job rows.
PG_SCHEMA_IDLE_IN_TRANSACTION_MS = 300_000

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


def _drop_mlfq_level(conn: Connection) -> None:
    """requests.mlfq_level goes: it was written 0 and read by nothing (the order has no levels),
    and as a NOT NULL column without a default it would refuse the rows this version inserts."""
    drop_column(conn, "requests", "mlfq_level")


def drop_column(conn: Connection, table: str, column: str, rebuild: bool | None = None) -> None:
    """Drop a column the current models no longer have (nothing when it is already gone).

    SQLite before 3.35 has no DROP COLUMN (and `rebuild` forces this path):
    the table is then copied into one made by the current model, its
    indexes with it, in the migration's transaction.
    """
    if column not in {c["name"] for c in inspect(conn).get_columns(table)}:
        return
    if rebuild is None:
        rebuild = conn.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35, 0)
    if not rebuild:
        conn.execute(text(f'ALTER TABLE {table} DROP COLUMN "{column}"'))
        return
    for index in inspect(conn).get_indexes(table):
        conn.execute(text(f'DROP INDEX "{index["name"]}"'))
    conn.execute(text(f"ALTER TABLE {table} RENAME TO {table}_before"))
    model = Base.metadata.tables[table]
    model.create(conn)
    columns = ", ".join(f'"{c.name}"' for c in model.columns)
    conn.execute(text(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_before"))
    conn.execute(text(f"DROP TABLE {table}_before"))


def _job_origins_and_chargeback(conn: Connection) -> None:
    """Prompt tokens per job (chargeback), each job's origin and API key, admin API keys, indexes for
    recent first tokens and for listings by origin.

    Each step checks first: a table an earlier step created is already current. Earlier jobs' origins
    are read from the names their doors gave them (and the batches that name their jobs).
    """
    _add_column(conn, "jobs", "num_prompt_tokens", "BIGINT NOT NULL DEFAULT 0")
    _add_column(conn, "jobs", "key_id", "VARCHAR(32)")
    if _add_column(conn, "jobs", "origin", "VARCHAR(16) NOT NULL DEFAULT 'submit'"):
        conn.execute(text("UPDATE jobs SET origin = 'online' WHERE name = 'http'"))
        conn.execute(text("UPDATE jobs SET origin = 'generate' WHERE name = 'generate'"))
        conn.execute(text("UPDATE jobs SET origin = 'batch' WHERE id IN (SELECT job_id FROM batches)"))
    _add_column(conn, "api_keys", "admin", "INTEGER NOT NULL DEFAULT 0")
    wanted = {"ix_requests_first_token_at", "ix_jobs_origin_id"}
    for table in ("requests", "jobs"):
        for index in Base.metadata.tables[table].indexes:
            if index.name in wanted:
                index.create(conn, checkfirst=True)


def _add_column(conn: Connection, table: str, column: str, ddl: str) -> bool:
    """Add a column the table lacks; whether it was added."""
    if column in {c["name"] for c in inspect(conn).get_columns(table)}:
        return False
    conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}"))
    return True


def _add_output_logprobs(conn: Connection) -> None:
    """Logprobs of the output tokens, written with them (NULL for the requests that asked none)."""
    if "output_logprobs" in {c["name"] for c in inspect(conn).get_columns("requests")}:
        return  # an older database made by create_all of these models (as tests make them)
    kind = JSON().compile(dialect=conn.dialect)  # the column as it was (a later version moves it)
    conn.execute(text(f"ALTER TABLE requests ADD COLUMN output_logprobs {kind}"))


def _add_choices(conn: Connection) -> None:
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
    conn.execute(text("ALTER TABLE requests RENAME TO requests_before"))
    for index in inspect(conn).get_indexes("requests_before"):
        conn.execute(text(f'DROP INDEX "{index["name"]}"'))
    Base.metadata.tables["requests"].create(conn)
    if "output_logprobs" in columns.split(", "):  # kept as it was: a later version moves it
        _add_column(conn, "requests", "output_logprobs", "JSON")
    conn.execute(text(f"INSERT INTO requests ({columns}) SELECT {columns} FROM requests_before"))
    conn.execute(text("DROP TABLE requests_before"))


def _chunked_files_and_rates(conn: Connection) -> None:
    """Uploads' content in pieces (file_chunks) instead of one value a file; the rate limits' tables.

    Each upload's content moves into pieces, one file at a time, and the
    column goes. On SQLite the file is switched to incremental vacuum after
    this step's transaction (`ensure_schema`), so deleted files give their
    space back.
    """
    for name in ("file_chunks", "key_limits", "key_rates"):
        Base.metadata.tables[name].create(conn, checkfirst=True)
    if "content" not in {c["name"] for c in inspect(conn).get_columns("files")}:
        return
    from fsched.storage.chunks import insert_chunks

    ids = conn.execute(text("SELECT id, created_at FROM files WHERE content IS NOT NULL")).all()
    for file_id, created_at in ids:
        content = conn.execute(text("SELECT content FROM files WHERE id = :id"), {"id": file_id}).scalar()
        insert_chunks(conn, file_id, memoryview(bytes(content)), created_at)
    drop_column(conn, "files", "content")


def _add_batch_expiry(conn: Connection) -> None:
    """When a batch's completion window ran out with its work unfinished (NULL: it did not)."""
    _add_column(conn, "batches", "expired_at", "FLOAT")


def _logprobs_in_pieces(conn: Connection) -> None:
    """Output logprobs appended in pieces (request_logprobs) instead of one value a request that every
    write rewrote: each request's value becomes its first piece, and the column goes."""
    Base.metadata.tables["request_logprobs"].create(conn, checkfirst=True)
    _add_column(conn, "requests", "num_logprobs", "INTEGER NOT NULL DEFAULT 0")
    if "output_logprobs" not in {c["name"] for c in inspect(conn).get_columns("requests")}:
        return
    from fsched.storage.logprobs import request_logprobs

    stored = conn.execute(text("SELECT id, output_logprobs FROM requests WHERE output_logprobs IS NOT NULL"))
    for key, value in stored.all():
        records = json.loads(value) if isinstance(value, str) else value
        if records:
            conn.execute(request_logprobs.insert().values(request_id=key, start=0, records=records))
            conn.execute(text("UPDATE requests SET num_logprobs = :n WHERE id = :id"),
                         {"n": len(records), "id": key})
    if conn.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35, 0):
        # No DROP COLUMN: copying the table would take the pieces' rows with it (their foreign key
        # follows the renamed table), so the column stays, emptied (nullable: inserts never name it).
        conn.execute(text("UPDATE requests SET output_logprobs = NULL"))
        return
    drop_column(conn, "requests", "output_logprobs")


def _add_render(conn: Connection) -> None:
    """A chat request's tools and template options (NULL: none)."""
    column = Base.metadata.tables["requests"].c.render
    _add_column(conn, "requests", "render", column.type.compile(dialect=conn.dialect))


def _add_batch_storage(conn: Connection) -> None:
    """What each batch's rows hold (its tenant's quota counts it) and when they were reclaimed. A batch
    made before is charged nothing for its requests: the bytes of the output files it has are its
    stored bytes (what was measured of it)."""
    if _add_column(conn, "batches", "stored_bytes", "BIGINT NOT NULL DEFAULT 0"):
        conn.execute(text("UPDATE batches SET stored_bytes = COALESCE((SELECT SUM(files.bytes) FROM files "
                          "WHERE files.job_id = batches.job_id), 0) WHERE job_id IS NOT NULL"))
    _add_column(conn, "batches", "reclaimed_at", "FLOAT")


def _output_in_pieces(conn: Connection) -> None:
    """A running request's output appended in pieces (request_output) instead of rewritten whole at every
    write: every row already holds all its output, so nothing moves."""
    Base.metadata.tables["request_output"].create(conn, checkfirst=True)


def _notify_changes(conn: Connection) -> None:
    """On PostgreSQL the tables a daemon's sync reads notify their changes (storage/changes.py), so a
    daemon looks only when something may have changed, as on SQLite."""
    if conn.dialect.name == "postgresql":
        for _, sql in changes.trigger_statements():
            conn.execute(text(sql))


changes.notify_on_create(Base.metadata.tables)

# MIGRATIONS[v] upgrades a database from version v to v + 1.
MIGRATIONS: dict[int, Migration] = {
    1: _v1_to_v2, 2: _v2_to_v3, 3: _drop_mlfq_level, 4: _job_origins_and_chargeback,
    5: _add_output_logprobs, 6: _add_choices, 7: _chunked_files_and_rates, 8: _add_batch_expiry,
    9: _logprobs_in_pieces,
    10: _add_render, 11: _add_batch_storage, 12: _output_in_pieces, 13: _notify_changes,
}


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
            limit = int(PG_SCHEMA_IDLE_IN_TRANSACTION_MS)
            conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {limit}"))
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
    if found < CHUNKED_FILES_VERSION <= version:
        db.make_space_reclaimable()
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
