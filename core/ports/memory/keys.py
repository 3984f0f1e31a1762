"""MemoryKeyStore: the KeyStore contract in memory: API keys, stored limits, rate limits.

Rates follow the SQL store's: one GCRA theoretical arrival time a key and
kind, moved by the core's one decision (`core.jobs.ratelimit.decide`) on the
rows' clock, and only when the request is let through.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from fsched.core.jobs.apikeys import ApiKey, new_key, validate_key_name
from fsched.core.jobs.ratelimit import RATE_KINDS, RateDecision, decide, rate_limits_of
from fsched.core.jobs.tenants import validate_tenant_name
from fsched.core.ports.memory.rows import MemoryRows, atomic
from fsched.core.ports.records import LimitsRead, UnknownKey
from fsched.core.types import RequestClass


class MemoryKeyStore:
    def __init__(self, rows: MemoryRows):
        self.rows = rows

    @atomic
    def create_key(self, tenant: str, request_class: RequestClass, name: str = "",
                   admin: bool = False) -> tuple[ApiKey, str]:
        validate_tenant_name(tenant)
        validate_key_name(name)
        made = new_key()
        key = ApiKey(made.id, tenant, request_class, name, made.secret_hash, self.rows.clock(), admin=admin)
        self.rows.api_keys[key.id] = key
        return key, made.key

    @atomic
    def get_key(self, key_id: str) -> ApiKey | None:
        return self.rows.api_keys.get(key_id)

    @atomic
    def list_keys(self) -> list[ApiKey]:
        return sorted(self.rows.api_keys.values(), key=lambda k: k.created_at)  # ties: in creation order

    @atomic
    def revoke_key(self, key_id: str) -> ApiKey:
        key = self.rows.api_keys.get(key_id)
        if key is None:
            raise UnknownKey(key_id)
        if not key.revoked:
            key = self.rows.api_keys[key_id] = ApiKey(
                key.id, key.tenant, key.request_class, key.name, key.secret_hash, key.created_at,
                self.rows.clock(), key.admin)
        return key

    # -- limits set by an admin ---------------------------------------------------------------

    @atomic
    def stored_limits(self) -> dict[str, int]:
        return dict(self.rows.limits)

    @atomic
    def set_limit(self, name: str, value: int | None) -> None:
        _set(self.rows.limits, name, value)

    # -- rate limits ----------------------------------------------------------------------------

    @atomic
    def key_limits(self, key_id: str) -> dict[str, int]:
        return dict(self.rows.key_limits.get(key_id, {}))

    @atomic
    def set_key_limit(self, key_id: str, name: str, value: int | None) -> None:
        if key_id not in self.rows.api_keys:
            raise UnknownKey(key_id)
        _set(self.rows.key_limits.setdefault(key_id, {}), name, value)

    def rate_limits(self, key_id: str) -> dict[str, int]:
        return self.stored_and_rate_limits([key_id]).rate_limits[key_id]

    @atomic
    def stored_and_rate_limits(self, key_ids: Collection[str]) -> LimitsRead:
        limits = self.rows.limits
        return LimitsRead(dict(limits), {k: rate_limits_of(limits, self.rows.key_limits.get(k, {}))
                                         for k in key_ids})

    @atomic
    def take_rate(self, key_id: str, limits: Mapping[str, int], costs: Mapping[str, int]) -> RateDecision:
        kinds = sorted({RATE_KINDS[name] for name in limits})
        if not kinds:
            return RateDecision(True, 0.0, {})
        tats = {kind: self.rows.key_rates.get((key_id, kind), 0.0) for kind in kinds}  # 0: nothing spent
        decision = decide(tats, self.rows.clock(), limits, costs)
        for kind, tat in decision.tats.items():
            self.rows.key_rates[key_id, kind] = tat
        return decision


def _set(limits: dict[str, int], name: str, value: int | None) -> None:
    """Store a limit, or (None) put it back to its default."""
    if value is None:
        limits.pop(name, None)
    else:
        limits[name] = int(value)
