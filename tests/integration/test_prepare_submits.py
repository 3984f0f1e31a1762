"""A fresh server's group commit made ready before its first online request (`prepare_submits`, called by
the server's start on the group commit's thread): that thread's first group takes no connection from
the pool (it keeps the one made ready), and on PostgreSQL it is the one round trip of every later group."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event

from fsched.storage import kept
from fsched.storage.sql_catalog import SqlCatalogStore
from tests.support.pgtrace import Traced
from tests.support.tables import submission


def _on_a_thread(call):
    """`call()` on a new thread (the group commit's own, as in the server), its result."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    thread.join(timeout=30)
    assert out, "the call did not end"
    return out[0]


def test_the_first_group_after_prepare_takes_no_connection(db_url):
    SqlCatalogStore(db_url).submit_each([submission(1, "carol")])  # the table and the tenant
    store = SqlCatalogStore(db_url)
    opened: list[object] = []
    event.listen(store.db.engine, "checkout", lambda dbapi_conn, _record, _proxy: opened.append(dbapi_conn))

    def ready_then_first_group() -> tuple[int, int]:
        store.prepare_submits()
        after_prepare = len(opened)
        outcomes = store.submit_each([submission(1, "carol")], max_queued_per_tenant=100)
        assert [o.tenant for o in outcomes] == ["carol"]
        return after_prepare, len(opened)

    after_prepare, after_group = _on_a_thread(ready_then_first_group)
    store.db.dispose()
    assert after_prepare == 1  # prepare took the thread's connection
    assert after_group == after_prepare  # and the group wrote on it


@pytest.fixture
def pg_store(pg_url, monkeypatch):
    monkeypatch.setattr(kept, "PING_IDLE_S", 3600.0)  # no ping, however slow the machine
    SqlCatalogStore(pg_url).submit_each([submission(1, "carol")])  # the table and the tenant
    made = SqlCatalogStore(pg_url)
    yield made
    made.db.dispose()


def test_after_prepare_the_first_group_is_one_round_trip_on_postgresql(pg_store, tmp_path):
    """Without it, the first group also opens its connection, sets its idle limit and prepares its
    statements (three round trips more)."""
    traced = Traced(pg_store, tmp_path / "trace")
    pg_store.prepare_submits()
    first_group = [submission(1, "carol")]
    assert traced.round_trips(lambda: pg_store.submit_each(first_group, max_queued_per_tenant=100)) == 1


def test_without_prepare_the_first_group_pays_for_its_connection(pg_store, tmp_path):
    """What `prepare_submits` spares the first request (the test above would pass without it otherwise)."""
    traced = Traced(pg_store, tmp_path / "trace")
    first_group = [submission(1, "carol")]
    assert traced.round_trips(lambda: pg_store.submit_each(first_group, max_queued_per_tenant=100)) > 1
