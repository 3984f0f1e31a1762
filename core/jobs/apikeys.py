"""API keys: the HTTP server's tenants. A key is shown once and stored only as a hash.

A key reads `fsk-<id>-<secret>`. The id is public (listings and `keys revoke`
name it) and finds the row; the secret is 32 random bytes, stored as its
SHA-256. A salted slow hash buys nothing for a secret of that entropy, and a
fast one keeps each HTTP request's check cheap. The check compares digests
in constant time, so the time it takes tells nothing about how much of a
guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from fsched.core.types import RequestClass

KEY_PREFIX = "fsk"
_KEY = re.compile(r"^fsk-([0-9a-f]{12})-([A-Za-z0-9_-]{43})$")
MAX_KEY_NAME = 128


@dataclass(slots=True, frozen=True)
class NewKey:
    """A key just made: `key` is shown to its owner once, `secret_hash` is what is stored."""

    id: str
    key: str
    secret_hash: str


@dataclass(slots=True, frozen=True)
class ApiKey:
    """A stored key: whose requests it makes, the highest class they get, and whether it may also
    administer over HTTP (see every tenant's work, change weights)."""

    id: str
    tenant: str
    request_class: RequestClass
    name: str
    secret_hash: str
    created_at: float
    revoked_at: float | None = None
    admin: bool = False

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def new_key() -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return NewKey(id=key_id, key=f"{KEY_PREFIX}-{key_id}-{secret}", secret_hash=hash_secret(secret))


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(key: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed key; None for anything else."""
    match = _KEY.match(key)
    return None if match is None else (match.group(1), match.group(2))


def secret_matches(secret: str, stored: ApiKey | None) -> bool:
    """Whether `secret` is the stored key's and the key is not revoked; constant time in the secret."""
    if stored is None:
        # Hash anyway: an unknown id takes as long as a wrong secret.
        hmac.compare_digest(hash_secret(secret), "0" * 64)
        return False
    return hmac.compare_digest(hash_secret(secret), stored.secret_hash) and not stored.revoked


def validate_key_name(name: str) -> str:
    if len(name) > MAX_KEY_NAME or not name.isprintable():
        raise ValueError(f"key name must be at most {MAX_KEY_NAME} printable characters")
    return name


def class_allowed(asked: RequestClass, ceiling: RequestClass) -> bool:
    """A request may ask for its key's class or a lower one, never a higher one."""
    return asked.band >= ceiling.band
