"""What a tenant's batches store, through the HTTP API on each job table (in memory, SQLite, PostgreSQL):
batch creations count toward the tenant's file quota, so creating and cancelling batches from one upload
cannot grow the table past it; ended batches' rows are reclaimed, their space given back or reused."""

from __future__ import annotations

import json
import os
import time

import pytest
from sqlalchemy import func, select, text

from fsched.api.expiry import reclaim_ended
from fsched.core.types import RequestClass
from tests.support.inprocess import InProcessServer
from tests.support.tables import KINDS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=KINDS)
def table(request):
    if request.param == "memory":
        from fsched.core.ports.memory import MemoryTable

        yield MemoryTable()
        return
    from fsched.storage.stores import JobTable

    made = JobTable(request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url"))
    yield made
    made.dispose()


def lines(n: int, prompt_bytes: int = 100) -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "m", "prompt": f"{i:06d}" + "x" * prompt_bytes,
                                        "max_tokens": 4}}) + "\n" for i in range(n)).encode()


def request_rows(table) -> int:
    if hasattr(table, "rows"):
        return len(table.rows.requests)
    with table._db.read() as conn:
        return conn.execute(text("SELECT COUNT(*) FROM requests")).scalar_one()


async def create(client, file_id: str):
    return await client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                  "completion_window": "24h"})


async def upload(client, content: bytes) -> str:
    made = await client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", content)})
    assert made.status_code == 200, made.text
    return made.json()["id"]


async def test_creating_and_cancelling_batches_from_one_upload_stops_at_the_quota(table):
    content = lines(300)
    key = table.keys.create_key("alice", RequestClass.BATCH)[1]
    async with InProcessServer(table) as server, server.http(key) as client:
        file_id = await upload(client, content)
        first = await create(client, file_id)
        assert first.status_code == 200, first.text
        charge = table.files.stored_bytes("alice") - len(content)
        assert charge >= len(content)  # each row holds its line's request, and more
        table.keys.set_limit("max_file_bytes_per_tenant", len(content) + int(2.5 * charge))
        server.state._limits.at = -1e18  # read the quota now, not within the cache's TTL
        made = [first]
        for _ in range(5):
            await client.post(f"/v1/batches/{made[-1].json()['id']}/cancel")
            answer = await create(client, file_id)
            if answer.status_code != 200:
                break
            made.append(answer)
        assert len(made) == 2  # the upload and two batches' rows fit; a third would not
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["code"] == "file_quota_exceeded", answer.text
        assert "max_file_bytes_per_tenant" in error["message"] and "past its quota" in error["message"]
        assert request_rows(table) == 2 * 300  # the refused creation stored no row
        listed = (await client.get("/v1/batches")).json()["data"]
        assert [b["status"] for b in listed] == ["cancelled", "cancelled"]

        # Past the retention their rows go; the batches still answer, and the room is back.
        assert sorted(reclaim_ended(server.state, time.time() + 1, 0)) == sorted(b.json()["id"] for b in made)
        assert request_rows(table) == 0 and table.files.stored_bytes("alice") == len(content)
        kept = (await client.get(f"/v1/batches/{made[0].json()['id']}")).json()
        assert kept["status"] == "cancelled" and kept["request_counts"] == {"total": 300, "completed": 0,
                                                                             "failed": 300}
        assert (await create(client, file_id)).status_code == 200
        assert request_rows(table) == 300


def table_bytes(table) -> int:
    """What the job table takes: the SQLite file's size, or PostgreSQL's requests table with its indexes,
    TOAST and logprobs."""
    db = table._db
    if db.dialect == "sqlite":
        path = db.url.removeprefix("sqlite:///")
        wal = path + "-wal"
        return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0)
    with db.read() as conn:
        return conn.execute(text("SELECT pg_total_relation_size('requests') "
                                 "+ pg_total_relation_size('request_logprobs')")).scalar_one()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_reclaimed_rows_give_their_space_back_or_to_the_next_batch(request, kind):
    from fsched.storage.logprobs import request_logprobs
    from fsched.storage.rows import requests
    from fsched.storage.stores import JobTable

    table = JobTable(request.getfixturevalue("pg_url" if kind == "postgresql" else "sqlite_url"))
    content = lines(2000, prompt_bytes=1500)
    key = table.keys.create_key("alice", RequestClass.BATCH)[1]
    try:
        async with InProcessServer(table) as server, server.http(key) as client:
            file_id = await upload(client, content)
            empty = table_bytes(table)
            made = await create(client, file_id)
            await client.post(f"/v1/batches/{made.json()['id']}/cancel")
            with table._db.write() as conn:  # logprobs pieces, as a daemon would have appended them
                ids = conn.execute(select(requests.c.id).limit(100)).scalars().all()
                conn.execute(request_logprobs.insert(), [{"request_id": i, "start": 0, "records": [[1, -0.5]]}
                                                         for i in ids])
            one_batch = table_bytes(table)
            assert one_batch - empty > len(content)
            assert reclaim_ended(server.state, time.time() + 1, 0) == [made.json()["id"]]
            with table._db.read() as conn:
                assert conn.execute(select(func.count()).select_from(request_logprobs)).scalar_one() == 0
            if kind == "sqlite":  # the file gives the pages back
                assert table_bytes(table) - empty < (one_batch - empty) / 4
            again = await create(client, file_id)
            assert again.status_code == 200
            # the freed space is what the next batch's rows take: the table grows by little more
            assert table_bytes(table) - one_batch < (one_batch - empty) / 4
    finally:
        table.dispose()


def test_a_reclaim_stopped_midway_is_finished_by_the_next(db_url):
    from fsched.core.jobs.batches import BatchRecord, new_batch_id
    from fsched.storage.rows import jobs, requests
    from fsched.storage.sql_files import batches
    from fsched.storage.stores import JobTable
    from tests.support.tables import submission

    table = JobTable(db_url)
    try:
        (job,) = table.catalog.submit([submission(5)])
        table.catalog.cancel_job(job.job_id)
        record = BatchRecord(new_batch_id(), "alice", job.job_id, "/v1/completions", "file-x", "24h",
                             None, 1.0)
        table.files.add_batch(record)
        with table._db.write() as conn:  # marked, then stopped before its rows went
            conn.execute(batches.update().values(reclaimed_at=5.0))
        assert table.files.stored_bytes("alice") == 0
        assert [b.id for b in table.files.reclaim_batches(ended_before=0.0)] == [record.id]
        with table._db.read() as conn:
            assert conn.execute(select(func.count()).select_from(requests)).scalar_one() == 0
            assert conn.execute(select(jobs.c.num_requests)).scalar_one() == 5
        assert table.files.get_batch("alice", record.id).reclaimed_at == 5.0
        assert table.files.reclaim_batches(ended_before=time.time() + 60) == []
    finally:
        table.dispose()
