"""API keys and stored limits: the pure rules."""

from __future__ import annotations

import pytest

from fsched.core.jobs.apikeys import ApiKey, class_allowed, hash_secret, new_key, secret_matches, split_key
from fsched.core.jobs.limits import InputLimits, limits_in_force, validate_limit
from fsched.core.types import RequestClass as C


def stored(made, revoked_at=None) -> ApiKey:
    return ApiKey(made.id, "alice", C.STREAMING, "", made.secret_hash, 0.0, revoked_at)


def test_a_new_key_splits_back_and_only_its_hash_is_kept():
    made = new_key()
    key_id, secret = split_key(made.key)
    assert key_id == made.id and secret not in made.secret_hash and made.key not in made.secret_hash
    assert made.secret_hash == hash_secret(secret) and len(made.secret_hash) == 64
    assert new_key().key != made.key  # random


def test_the_secret_matches_only_its_own_unrevoked_key():
    made, other = new_key(), new_key()
    secret = split_key(made.key)[1]
    assert secret_matches(secret, stored(made))
    assert not secret_matches(split_key(other.key)[1], stored(made))
    assert not secret_matches(secret, stored(made, revoked_at=1.0))
    assert not secret_matches(secret, None)


@pytest.mark.parametrize("bad", ["", "sk-abc", "fsk-123-abc", "fsk-" + "g" * 12 + "-" + "a" * 43, "x" * 300])
def test_malformed_keys_do_not_split(bad):
    assert split_key(bad) is None


def test_a_request_may_ask_for_its_keys_class_or_lower_only():
    assert class_allowed(C.BATCH, C.REALTIME) and class_allowed(C.STREAMING, C.STREAMING)
    assert not class_allowed(C.REALTIME, C.STREAMING) and not class_allowed(C.STREAMING, C.BATCH)


def test_stored_limits_apply_and_the_environment_only_lowers_them():
    assert limits_in_force({}, {}) == InputLimits()
    limits = limits_in_force({"max_queued_per_tenant": 10, "max_lines": 100}, {})
    assert (limits.max_queued_per_tenant, limits.max_lines) == (10, 100)
    env = {"FSCHED_MAX_QUEUED_PER_TENANT": "1000", "FSCHED_MAX_LINES": "7"}
    limits = limits_in_force({"max_queued_per_tenant": 10}, env)
    assert (limits.max_queued_per_tenant, limits.max_lines) == (10, 7)  # raised: no; lowered: yes
    assert limits_in_force({"max_tokens": 100}, {}).default_max_tokens == 100  # kept within max_tokens


def test_only_known_positive_limits_may_be_stored():
    assert validate_limit("max_lines", 3) == 3
    with pytest.raises(ValueError, match="unknown limit"):
        validate_limit("max_power", 3)
    with pytest.raises(ValueError, match=">= 1"):
        validate_limit("max_lines", 0)
