"""GCRA's decisions for the per-key rate limits: at the limit, one past it, and the wait."""

from __future__ import annotations

import pytest

from fsched.core.jobs.limits import limit_rows, validate_limit, validate_limit_name
from fsched.core.jobs.ratelimit import decide, gcra, never_fits, rate_limits_of


def admitted(per_minute: int, n: int, now: float = 1000.0, cost: int = 1) -> tuple[int, float | None]:
    """How many of n requests at `now` pass, and the first refusal's wait."""
    tat, passed = None, 0
    for _ in range(n):
        ok, tat, wait = gcra(tat, now, per_minute, cost)
        if not ok:
            return passed, wait
        passed += 1
    return passed, None


@pytest.mark.parametrize("per_minute", [1, 3, 60, 7, 1000])
def test_a_minutes_worth_passes_at_once_and_the_next_waits_one_interval(per_minute):
    assert admitted(per_minute, per_minute) == (per_minute, None)
    passed, wait = admitted(per_minute, per_minute + 1)
    assert passed == per_minute and wait == pytest.approx(60.0 / per_minute)


def test_after_the_wait_one_more_passes_and_a_refusal_spends_nothing():
    tat = None
    for _ in range(3):
        _, tat, _ = gcra(tat, 0.0, 3, 1)
    ok, same, wait = gcra(tat, 0.0, 3, 1)
    assert not ok and same == tat and wait == pytest.approx(20.0)
    assert not gcra(tat, 19.9, 3, 1)[0]
    assert gcra(tat, 20.0, 3, 1)[0]
    assert gcra(tat, 60.0, 3, 3)[0]  # a minute later, a minute's worth again


def test_tokens_cost_their_count_and_every_limit_must_agree():
    limits = {"requests_per_minute": 10, "tokens_per_minute": 100}
    first = decide({}, 0.0, limits, {"requests": 1, "tokens": 100})
    assert first.allowed and set(first.tats) == {"requests", "tokens"}
    second = decide(first.tats, 0.0, limits, {"requests": 1, "tokens": 1})
    assert not second.allowed and second.refused_by == "tokens_per_minute" and second.tats == {}
    assert second.retry_after_s == pytest.approx(0.6)
    assert decide(first.tats, 0.0, {"requests_per_minute": 10}, {"requests": 1}).allowed
    assert never_fits(limits, {"tokens": 101}) == "tokens_per_minute"
    assert never_fits(limits, {"tokens": 100}) is None


def test_a_keys_own_limit_wins_over_the_tables_and_none_is_unlimited():
    assert rate_limits_of({}, {}) == {}
    assert rate_limits_of({"requests_per_minute": 5, "max_lines": 3}, {}) == {"requests_per_minute": 5}
    own = {"requests_per_minute": 50, "tokens_per_minute": 9}
    assert rate_limits_of({"requests_per_minute": 5}, own) == own


def test_only_rate_limits_go_on_a_key_and_show_says_where_each_comes_from():
    assert validate_limit("requests_per_minute", 5, per_key=True) == 5
    with pytest.raises(ValueError, match="only the rate limits"):
        validate_limit_name("max_lines", per_key=True)
    with pytest.raises(ValueError, match="unknown limit"):
        validate_limit_name("max_power")
    rows = {r["name"]: r for r in limit_rows({"tokens_per_minute": 7, "max_lines": 2})}
    assert rows["max_lines"]["from"] == "table" and rows["max_bytes"]["from"] == "default"
    assert rows["requests_per_minute"] == {"name": "requests_per_minute", "value": None, "set": False,
                                           "from": "default"}
    assert rows["tokens_per_minute"]["value"] == 7
    keyed = {r["name"]: r for r in limit_rows({"tokens_per_minute": 7}, {"requests_per_minute": 3})}
    assert set(keyed) == {"requests_per_minute", "tokens_per_minute"}
    assert keyed["requests_per_minute"]["from"] == "key" and keyed["tokens_per_minute"]["from"] == "table"


def test_logprobs_are_charged_a_token_for_every_so_many_records():
    from fsched.core.jobs.ratelimit import charged_tokens

    assert charged_tokens(150, None, 20) == 150
    assert charged_tokens(150, 0, 20) == 150 + 8  # 150 records: 7.5, rounded up
    assert charged_tokens(150, 19, 20) == 300 and charged_tokens(150, 20, 20) == 150 + 158
    assert charged_tokens(150, 20, 1_000_000) == 151  # an admin who does not charge them
