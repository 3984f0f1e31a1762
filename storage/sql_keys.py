"""API keys and admin-set limits in the job table: small tables, one transaction a call."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

from sqlalchemy import select, update

from fsched.core.jobs.apikeys import ApiKey, new_key, validate_key_name
from fsched.core.jobs.ratelimit import RateDecision, rate_limits_of
from fsched.core.jobs.tenants import validate_tenant_name
from fsched.core.ports.records import LimitsRead, UnknownKey
from fsched.core.types import RequestClass
from fsched.storage import sql_limits
from fsched.storage.db import Database
from fsched.storage.models import ApiKeyRow, Meta
from fsched.storage.schema import ensure_schema

keys = ApiKeyRow.__table__
meta = Meta.__table__


class SqlKeyStore:
    def __init__(self, db: Database | str | None = None, clock=time.time):
        self.db = db if isinstance(db, Database) else Database(db)
        self.clock = clock
        ensure_schema(self.db)

    def create_key(self, tenant: str, request_class: RequestClass, name: str = "",
                   admin: bool = False) -> tuple[ApiKey, str]:
        """Store a new key for `tenant` (an admin key with `admin`); return it and the key itself
        (shown once, never stored)."""
        validate_tenant_name(tenant)
        validate_key_name(name)
        made = new_key()
        row = {"id": made.id, "tenant": tenant, "class": request_class.value, "name": name,
               "secret_hash": made.secret_hash, "created_at": self.clock(), "admin": int(admin)}
        with self.db.write() as conn:
            conn.execute(keys.insert().values(**row))
        return _key(row), made.key

    def get_key(self, key_id: str) -> ApiKey | None:
        with self.db.read() as conn:
            row = conn.execute(select(keys).where(keys.c.id == key_id)).first()
        return None if row is None else _key(row._mapping)

    def list_keys(self) -> list[ApiKey]:
        with self.db.read() as conn:
            rows = conn.execute(select(keys).order_by(keys.c.created_at, keys.c.id)).all()
        return [_key(row._mapping) for row in rows]

    def revoke_key(self, key_id: str) -> ApiKey:
        """Revoke a key at once (the next request with it is refused); revoking twice is no error."""
        with self.db.write() as conn:
            conn.execute(update(keys).where(keys.c.id == key_id, keys.c.revoked_at.is_(None))
                         .values(revoked_at=self.clock()))
            row = conn.execute(select(keys).where(keys.c.id == key_id)).first()
        if row is None:
            raise UnknownKey(key_id)
        return _key(row._mapping)

    # -- limits set by an admin -------------------------------------------------------------

    def stored_limits(self) -> dict[str, int]:
        return sql_limits.stored_limits(self.db)

    def set_limit(self, name: str, value: int | None) -> None:
        """Store a limit (None: back to its default)."""
        key = sql_limits.LIMIT_PREFIX + name
        with self.db.write() as conn:
            conn.execute(meta.delete().where(meta.c.key == key))
            if value is not None:
                conn.execute(meta.insert().values(key=key, value=str(int(value))))

    # -- rate limits ------------------------------------------------------------------------

    def key_limits(self, key_id: str) -> dict[str, int]:
        return sql_limits.limits_of_keys(self.db, [key_id]).get(key_id, {})

    def set_key_limit(self, key_id: str, name: str, value: int | None) -> None:
        """Store a rate limit on one key (None: back to the table-wide one); UnknownKey for none."""
        if self.get_key(key_id) is None:
            raise UnknownKey(key_id)
        sql_limits.set_key_limit(self.db, key_id, name, value)

    def rate_limits(self, key_id: str) -> dict[str, int]:
        """The rate limits on a key: its own, else the table-wide ones (none: unlimited)."""
        return self.stored_and_rate_limits([key_id]).rate_limits[key_id]

    def stored_and_rate_limits(self, key_ids: Collection[str]) -> LimitsRead:
        """`stored_limits`, and `rate_limits` of each key: one statement (more past hundreds of keys)."""
        table_wide, own = sql_limits.stored_and_of_keys(self.db, key_ids)
        return LimitsRead(table_wide, {k: rate_limits_of(table_wide, own.get(k, {})) for k in key_ids})

    def take_rate(self, key_id: str, limits: Mapping[str, int], costs: Mapping[str, int]) -> RateDecision:
        """Admit a request of `costs` under `limits` (moving the key's rate), or say how long to wait."""
        return sql_limits.take(self.db, key_id, limits, costs)


def _key(row) -> ApiKey:
    return ApiKey(id=row["id"], tenant=row["tenant"], request_class=RequestClass(row["class"]),
                  name=row["name"], secret_hash=row["secret_hash"], created_at=row["created_at"],
                  revoked_at=row.get("revoked_at"), admin=bool(row.get("admin")))
