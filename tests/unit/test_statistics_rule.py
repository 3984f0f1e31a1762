"""When the daemon analyzes a PostgreSQL table again: the rule of storage/statistics.py, alone."""

from __future__ import annotations

from fsched.storage.statistics import MIN_CHANGES, SHARE, stale, stale_tables


def test_a_table_never_analyzed_is_due_once_it_has_changed_by_the_minimum():
    assert not stale(MIN_CHANGES - 1, -1)
    assert stale(MIN_CHANGES, -1)


def test_a_small_table_waits_for_the_minimum_a_large_one_for_its_share():
    assert not stale(MIN_CHANGES - 1, 100)  # a tenth of 100 is less than the minimum
    big = 1_000_000
    assert not stale(int(SHARE * big) - 1, big)
    assert stale(int(SHARE * big), big)


def test_the_tables_due_are_named_in_the_order_read():
    found = [("jobs", 10_000, 1_000.0), ("requests", 3, 1_000.0), ("other", None, -1.0)]
    assert stale_tables(found) == {"jobs": 10_000}
