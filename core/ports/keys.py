"""KeyStore: the HTTP server's API keys and the limits an admin stored, in the job table.

An API key is a tenant for `fsched serve`; `fsched keys` and `fsched limits`
manage them, the server reads them on every request.

What every implementation must hold:

1. **The key is never stored.** `create_key` returns the key once; the
   table keeps only its id and a hash of its secret (`core.jobs.apikeys`).
2. **A revocation is at once and for good.** After `revoke_key` the key's
   record reads revoked (the server refuses its next request); revoking
   twice changes nothing and is no error; an unknown id raises
   `records.UnknownKey`.
3. **Limits by name.** `stored_limits` gives exactly the limits an admin set
   (name -> value), none for those left at their default; `set_limit` with
   None puts one back to its default. Names and values are checked by the
   caller (`core.jobs.limits.validate_limit`).
4. **Rate limits per key.** `rate_limits` gives a key's own limits where an
   admin set them, else the table-wide ones (stored limits too:
   `stored_and_rate_limits` reads both, for many keys at once). `take_rate`
   admits a request or refuses it, atomically for every caller of every
   process: N requests at a limit of N a minute pass at once, the next is
   refused with the wait (a refusal changes nothing).
5. **Short transactions.** Each call is one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.ratelimit import RateDecision
from fsched.core.ports.records import LimitsRead
from fsched.core.types import RequestClass


@runtime_checkable
class KeyStore(Protocol):
    def create_key(self, tenant: str, request_class: RequestClass, name: str = "",
                   admin: bool = False) -> tuple[ApiKey, str]:
        """Store a new key for `tenant` (with `admin`, one that may also administer over HTTP); return
        its record and the key itself (shown once, never stored).

        ValueError for a bad tenant name or label.
        """
        ...

    def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, revoked or not; None for none."""
        ...

    def list_keys(self) -> list[ApiKey]:
        """Every key, oldest first."""
        ...

    def revoke_key(self, key_id: str) -> ApiKey:
        """Revoke a key (again: no change); its record after. UnknownKey for an unknown id."""
        ...

    def stored_limits(self) -> dict[str, int]:
        """The limits an admin set, by name."""
        ...

    def set_limit(self, name: str, value: int | None) -> None:
        """Store a limit (None: back to its default)."""
        ...

    def key_limits(self, key_id: str) -> dict[str, int]:
        """The rate limits an admin set on this key, by name."""
        ...

    def set_key_limit(self, key_id: str, name: str, value: int | None) -> None:
        """Store a rate limit on one key (None: back to the table-wide one). UnknownKey for none."""
        ...

    def rate_limits(self, key_id: str) -> dict[str, int]:
        """The rate limits on a key, by name: its own, else the table-wide ones; none: unlimited."""
        ...

    def stored_and_rate_limits(self, key_ids: Collection[str]) -> LimitsRead:
        """`stored_limits`, and `rate_limits` of each key, read at once (a server keeping its limits and
        the rate limits of the keys in use fresh: the table-wide rate limits are stored limits too)."""
        ...

    def take_rate(self, key_id: str, limits: Mapping[str, int], costs: Mapping[str, int]) -> RateDecision:
        """Admit a request of `costs` (kind -> amount) under `limits` (name -> per minute), or refuse it
        with the seconds to wait."""
        ...
