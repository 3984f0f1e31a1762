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
4. **Short transactions.** Each call is one transaction.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fsched.core.jobs.apikeys import ApiKey
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
