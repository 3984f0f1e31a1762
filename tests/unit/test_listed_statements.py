"""A listed statement's compiled forms (storage/prepared.py): on SQLite one variant a power of two, its list
padded; on PostgreSQL one variant for every length, its list a single array parameter (the driver
rewrites a statement of more than 50 parameters afresh at every execution)."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from fsched.storage.prepared import Prepared, listed
from fsched.storage.rows import requests

READ = Prepared(lambda n: select(requests.c.id).where(listed(requests.c.id, "b_ids", n)), listed="b_ids")
PG = postgresql.psycopg.dialect()
LITE = sqlite.pysqlite.dialect()


def test_on_postgresql_every_length_is_one_statement_with_one_array_parameter():
    one, one_params = READ.bound(PG, {"b_ids": [7]})
    many, many_params = READ.bound(PG, {"b_ids": list(range(1, 301))})
    assert one is many
    assert "= ANY (%(b_ids)s::" in many.sql and "b_ids_" not in many.sql
    assert one_params == {"b_ids": [7]}
    assert many_params == {"b_ids": list(range(1, 301))}


def test_on_postgresql_a_list_of_any_sequence_goes_as_a_list():
    _, params = READ.bound(PG, {"b_ids": (3, 1, 2)})
    assert params == {"b_ids": [3, 1, 2]}


def test_on_sqlite_a_list_is_padded_to_its_power_of_two_by_its_last_value():
    compiled, params = READ.bound(LITE, {"b_ids": [5, 6, 9]})
    assert compiled is READ.bound(LITE, {"b_ids": [1, 2, 3, 4]})[0]
    assert compiled is not READ.bound(LITE, {"b_ids": [1, 2, 3, 4, 5]})[0]
    assert list(params) == [5, 6, 9, 9]


@pytest.mark.parametrize("dialect", [PG, LITE], ids=["postgresql", "sqlite"])
def test_an_empty_list_is_refused(dialect):
    with pytest.raises(ValueError, match="at least one value"):
        READ.bound(dialect, {"b_ids": []})
