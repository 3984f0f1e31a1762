"""The in-memory job table as one database: what one store writes the others read, `memory:NAME` opens it
where a URL names a table, and each store call is atomic across threads. (Each store's own rules are in
the contract suites, tests/integration/test_*_contract.py, which run it beside SQLite and PostgreSQL.)"""

from __future__ import annotations

import json
import os
import threading

import pytest

from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.memory import MemoryTable
from fsched.core.ports.records import Completion, JobSubmission, TokenUpdate
from fsched.core.ports.table import Table
from fsched.core.types import JobState, RequestClass, RequestStatus
from fsched.storage.stores import forget_memory_table, open_table
from tests.fakes import FakeClock


def job(n: int, tenant: str = "alice") -> JobSubmission:
    lines = "".join(json.dumps({"custom_id": f"c{i}", "prompt": f"p{i}", "max_tokens": 4}) + "\n"
                    for i in range(n))
    return JobSubmission(parse_job_file(lines.encode(), "f.jsonl"), tenant, RequestClass.STREAMING, 5, "f")


def test_what_the_catalog_stores_the_queue_claims_and_what_it_writes_every_read_sees():
    table = MemoryTable(FakeClock(100.0))
    assert isinstance(table, Table) and not table.sqlite and table.daemon_lock() is None
    (submitted,) = table.catalog.submit([job(2)])
    a, b = table.queue.claim("d", per_group=5)
    assert table.queue.flush_tokens("d", [TokenUpdate(a.id, (7,), "w7", first_token_at=100.5)]) == 1
    assert table.serving.progress([submitted.job_id])[submitted.job_id][0].output_text == "w7"
    assert table.queue.finish_requests([Completion(a.id, RequestStatus.FINISHED_STOPPED, (7, 8), "w7 w8"),
                                        Completion(b.id, RequestStatus.FINISHED_FAILED, error="boom")]
                                       ) == [True, True]
    (summary,) = table.catalog.list_jobs()
    assert summary.state is JobState.COMPLETED and summary.num_output_tokens == 2
    assert [r.output_text for r in table.catalog.iter_results(submitted.job_id)] == ["w7 w8"]
    assert table.serving.first_tokens(100.0)[RequestClass.STREAMING].count == 1


def test_a_memory_url_opens_this_processs_table_of_that_name(monkeypatch):
    url = "memory:test-open"
    table = open_table(url)
    try:
        assert isinstance(table, MemoryTable) and open_table(url) is table
        assert open_table("memory:another") is not table
        monkeypatch.setenv("FSCHED_DB", url)
        assert open_table() is table  # FSCHED_DB names it as --db does
        # Made by this process: its user owns it, as the user who made an SQLite file does.
        assert table.catalog.file_owner() == os.geteuid()
    finally:
        forget_memory_table(url)
        forget_memory_table("memory:another")
    assert open_table(url) is not table  # forgotten: the next open makes a new one
    forget_memory_table(url)


def test_store_calls_from_many_threads_are_each_atomic():
    table = MemoryTable()
    table.catalog.submit([job(200)])
    claimed: list[list] = []
    start = threading.Barrier(8)

    def claim() -> None:
        start.wait()
        for _ in range(50):
            claimed.append(table.queue.claim(f"d{threading.get_ident()}", per_group=1))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [c.id for batch in claimed for c in batch]
    assert len(ids) == len(set(ids)) == 200  # each request claimed once, none lost
    (summary,) = table.catalog.list_jobs()
    assert summary.counts.num_running == 200


def test_a_duplicate_custom_id_refuses_the_whole_submit():
    from fsched.core.ports.records import StoreError

    table = MemoryTable()
    spec = job(1).requests[0]
    twice = JobSubmission((spec, spec), "bob", RequestClass.BATCH, 5, "f")
    with pytest.raises(StoreError, match="duplicate custom_id 'c0'"):
        table.catalog.submit([job(1), twice])
    assert table.catalog.list_jobs() == [] and table.catalog.list_tenants() == []
