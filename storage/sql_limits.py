"""Limits in the job table: those an admin stored (table-wide, and rate limits on keys), and each key's
rate so far.

A key's rate is one row a kind (requests, tokens) holding GCRA's theoretical
arrival time on the database's clock. Every `fsched serve` replica admits a
request by moving those rows in one short write transaction (the rows locked
on PostgreSQL, SQLite's writers take turns), so a limit holds for the key
across every replica behind the table, and replicas whose clocks disagree
still agree. A key without a limit costs no write.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import String, bindparam, cast, delete, null, select, text, union_all, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fsched.core.jobs.ratelimit import RATE_KINDS, RateDecision, decide
from fsched.storage.db import Database
from fsched.storage.models import KeyLimit, KeyRate, Meta
from fsched.storage.prepared import Prepared, listed

key_limits = KeyLimit.__table__
key_rates = KeyRate.__table__
meta = Meta.__table__
ByKey = dict[str, dict[str, int]]  # limits (name -> value) by key id
LIMIT_PREFIX = "limit."  # a table-wide limit is the meta row limit.<name>
IDS_A_STATEMENT = 256  # keys in one IN list (SQLite bounds the parameters of a statement)
STORED_LIMITS = Prepared(select(meta.c.key, meta.c.value).where(meta.c.key.like(f"{LIMIT_PREFIX}%")))
LIMITS_OF_KEYS = Prepared(lambda n: select(key_limits.c.key_id, key_limits.c.name, key_limits.c.value)
                          .where(listed(key_limits.c.key_id, "b_keys", n)), listed="b_keys")
# Both in one statement: the table-wide limits' rows (key_id NULL), then the listed keys' own.
STORED_AND_OF_KEYS = Prepared(lambda n: union_all(
    select(cast(null(), String).label("key_id"), meta.c.key.label("name"), meta.c.value)
    .where(meta.c.key.like(f"{LIMIT_PREFIX}%")),
    select(key_limits.c.key_id, key_limits.c.name, cast(key_limits.c.value, String))
    .where(listed(key_limits.c.key_id, "b_keys", n))), listed="b_keys")


def stored_limits(db: Database) -> dict[str, int]:
    """The table-wide limits an admin stored, by name."""
    return {row.key[len(LIMIT_PREFIX):]: int(row.value) for row in db.rows(STORED_LIMITS)}


def stored_and_of_keys(db: Database, key_ids: Collection[str]) -> tuple[dict[str, int], ByKey]:
    """`stored_limits` and `limits_of_keys` in one statement (a few more past IDS_A_STATEMENT keys): a
    server keeping its limits and its keys' rate limits fresh reads both every second."""
    ids = sorted(set(key_ids))
    if not ids:
        return stored_limits(db), {}
    table_wide: dict[str, int] = {}
    own = limits_of_keys(db, ids[IDS_A_STATEMENT:])
    for row in db.rows(STORED_AND_OF_KEYS, {"b_keys": ids[:IDS_A_STATEMENT]}):
        if row.key_id is None:
            table_wide[row.name[len(LIMIT_PREFIX):]] = int(row.value)
        else:
            own.setdefault(row.key_id, {})[row.name] = int(row.value)
    return table_wide, own


def limits_of_keys(db: Database, key_ids: Collection[str]) -> ByKey:
    """The limits an admin set on each key, by name (only the keys with limits of their own),
    IDS_A_STATEMENT keys a read (a consistent whole is not needed: each key's limits are its rows)."""
    ids, found = sorted(set(key_ids)), {}
    for at in range(0, len(ids), IDS_A_STATEMENT):
        for row in db.rows(LIMITS_OF_KEYS, {"b_keys": ids[at:at + IDS_A_STATEMENT]}):
            found.setdefault(row.key_id, {})[row.name] = int(row.value)
    return found


def set_key_limit(db: Database, key_id: str, name: str, value: int | None) -> None:
    with db.write() as conn:
        conn.execute(delete(key_limits).where(key_limits.c.key_id == key_id, key_limits.c.name == name))
        if value is not None:
            conn.execute(key_limits.insert().values(key_id=key_id, name=name, value=int(value)))


def take(db: Database, key_id: str, limits: Mapping[str, int], costs: Mapping[str, int]) -> RateDecision:
    """Admit a request of `costs` (kind -> amount) under `limits` (name -> per minute), or not."""
    kinds = sorted({RATE_KINDS[name] for name in limits})
    if not kinds:
        return RateDecision(True, 0.0, {})
    with db.write() as conn:
        if db.dialect == "postgresql":
            # A rate is no record: a crash may lose its last milliseconds of counting, and the
            # request need not wait for the commit's flush to disk.
            conn.execute(text("SET LOCAL synchronous_commit TO OFF"))
        rows = _rates(conn, db, key_id, kinds)
        if len(rows) < len(kinds):  # a key's first request makes its rows (TAT 0: nothing spent)
            insert = pg_insert if db.dialect == "postgresql" else sqlite_insert
            conn.execute(insert(key_rates).on_conflict_do_nothing(),
                         [{"key_id": key_id, "kind": kind, "tat": 0.0} for kind in kinds])
            rows = _rates(conn, db, key_id, kinds)
        decision = decide({row.kind: row.tat for row in rows}, rows[0].now, limits, costs)
        if decision.tats:
            conn.execute(SET_TAT, [{"b_key": key_id, "b_kind": kind, "b_tat": tat}
                                   for kind, tat in decision.tats.items()])
    return decision


def _rates(conn, db: Database, key_id: str, kinds: list[str]) -> list:
    """The key's rows of these kinds, locked on PostgreSQL, each with the database's clock."""
    query = select(key_rates.c.kind, key_rates.c.tat, db.now().label("now")).where(
        key_rates.c.key_id == key_id, key_rates.c.kind.in_(kinds))
    if db.dialect == "postgresql":
        query = query.with_for_update(of=key_rates)
    return conn.execute(query).all()


SET_TAT = (update(key_rates)
           .where(key_rates.c.key_id == bindparam("b_key"), key_rates.c.kind == bindparam("b_kind"))
           .values(tat=bindparam("b_tat")))
