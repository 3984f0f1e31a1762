"""The FileStore contract, one set of tests run on every implementation: in memory, SQLite, PostgreSQL.

Uploads kept exactly and read back in pieces, a per-tenant quota on their
bytes, outputs attached once, and every file and batch seen by its own
tenant only.
"""

from __future__ import annotations

import io
import random

import pytest

from fsched.core.jobs.batches import BatchRecord, new_batch_id
from fsched.core.ports.files import PIECE_BYTES, FileStore
from fsched.core.ports.records import FileQuotaExceeded
from tests.support.tables import KINDS, open_table, submission


@pytest.fixture(params=KINDS)
def table(request):
    made = open_table(request, request.param)
    yield made
    made.close()


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def test_it_is_a_file_store(table):
    assert isinstance(table.files, FileStore)


def test_an_upload_is_stored_and_read_back_in_pieces(table):
    files = table.files
    data = blob(2 * PIECE_BYTES + 12345)
    f = files.add_file("alice", "batch", "in.jsonl", io.BytesIO(data))
    assert f.bytes == len(data) and table.pieces_stored() == 3
    assert files.file_content("alice", f.id) == data
    parts = list(files.iter_content("alice", f.id))
    assert [len(p) for p in parts] == [PIECE_BYTES, PIECE_BYTES, 12345] and b"".join(parts) == data
    assert files.iter_content("bob", f.id) is None and files.file_content("bob", f.id) is None
    assert files.add_file("alice", "batch", "empty.jsonl", b"").bytes == 0
    assert files.stored_bytes("alice") == len(data) and files.stored_bytes("bob") == 0


class Unreadable(io.RawIOBase):
    def read(self, size=-1):
        raise AssertionError("the quota should have refused this upload before reading it")


def test_the_quota_takes_an_upload_at_it_and_refuses_one_byte_past(table):
    files = table.files
    first = files.add_file("alice", "batch", "a.jsonl", blob(1000), quota=3000)
    at_quota = files.add_file("alice", "batch", "b.jsonl", io.BytesIO(blob(2000)), quota=3000)
    assert files.stored_bytes("alice") == 3000
    pieces_before = table.pieces_stored()
    with pytest.raises(FileQuotaExceeded, match="quota of 3,000 bytes"):
        files.add_file("alice", "batch", "c.jsonl", io.BytesIO(b"x"), quota=3000)
    with pytest.raises(FileQuotaExceeded):  # the declared size refuses before a byte is read
        files.add_file("alice", "batch", "d.jsonl", Unreadable(), quota=3000, size_hint=1)
    assert table.pieces_stored() == pieces_before and len(files.list_files("alice")) == 2  # nothing stored
    assert files.add_file("bob", "batch", "b", blob(3000), quota=3000).bytes == 3000  # others: their own
    assert files.delete_file("alice", first.id)  # room again
    assert files.add_file("alice", "batch", "c.jsonl", blob(1000), quota=3000).bytes == 1000
    assert files.file_content("alice", at_quota.id) == blob(2000)


def test_a_refused_upload_larger_than_a_piece_leaves_no_pieces(table):
    with pytest.raises(FileQuotaExceeded):
        table.files.add_file("alice", "batch", "big", io.BytesIO(blob(3 * PIECE_BYTES)),
                             quota=PIECE_BYTES + 1)
    assert table.pieces_stored() == 0 and table.files.list_files("alice") == []


def test_deleting_a_file_drops_its_pieces_at_once(table):
    files = table.files
    f = files.add_file("alice", "batch", "big.jsonl", io.BytesIO(blob(4 * PIECE_BYTES)))
    files.add_file("alice", "batch", "small.jsonl", b"keep me\n")
    assert files.delete_file("alice", f.id)
    assert table.pieces_stored() == 1 and files.iter_content("alice", f.id) is None
    assert files.get_file("alice", f.id) is None and not files.delete_file("alice", f.id)


def test_files_and_batches_are_seen_only_by_their_tenant(table):
    files = table.files
    f = files.add_file("alice", "batch", "in.jsonl", b"line\n")
    assert files.get_file("alice", f.id) == f and files.file_content("alice", f.id) == b"line\n"
    assert files.get_file("bob", f.id) is None and files.file_content("bob", f.id) is None
    assert files.list_files("bob") == [] and not files.delete_file("bob", f.id)
    made = []
    for i in range(5):
        record = BatchRecord(new_batch_id(), "alice", None, "/v1/completions", f.id, "24h", {"i": str(i)},
                             1.0 + i)
        files.add_batch(record)
        made.append(record.id)
    assert files.get_batch("bob", made[0]) is None and files.list_batches("bob", None, 10) == []
    assert files.list_batches("bob", made[0], 10) == []  # another tenant's id pages nothing
    newest_first = [b.id for b in files.list_batches("alice", None, 3)]
    assert newest_first == made[::-1][:3]
    assert [b.id for b in files.list_batches("alice", newest_first[-1], 10)] == made[::-1][3:]
    first = files.attach_outputs(files.get_batch("alice", made[0]), (10, 0))
    again = files.attach_outputs(files.get_batch("alice", made[0]), (10, 0))
    assert first.output_file_id == again.output_file_id is not None  # once, whoever asks twice
    assert files.get_file("alice", first.output_file_id).purpose == "batch_output"
    assert len(files.list_files("alice")) == 3
    assert files.delete_file("alice", f.id) and files.get_file("alice", f.id) is None


def test_the_file_list_pages_newest_or_oldest_first(table):
    files = table.files
    made = [files.add_file("alice", "batch", f"{i}.jsonl", b"x\n").id for i in range(5)]
    newest = [f.id for f in files.list_files("alice")]
    assert sorted(newest) == sorted(made)
    oldest = [f.id for f in files.list_files("alice", newest_first=False)]
    assert oldest == newest[::-1]  # the exact reverse, ties of time and all
    assert [f.id for f in files.list_files("alice", limit=2, after=newest[1])] == newest[2:4]
    assert [f.id for f in files.list_files("alice", newest_first=False, after=oldest[2])] == oldest[3:]
    assert files.list_files("bob", after=made[0]) == []  # another tenant's id pages nothing
    assert files.list_files("alice", purpose="batch_output") == []


def test_the_expiry_sweep_reads_unfinished_batches_and_marks_them_once(table):
    running, ended, later = table.catalog.submit([submission(2), submission(1), submission(1)])
    table.catalog.cancel_job(ended.job_id)
    f = table.files.add_file("alice", "batch", "in.jsonl", b"line\n")
    records = [BatchRecord(new_batch_id(), "alice", job, "/v1/completions", f.id, "24h", None, at)
               for job, at in ((running.job_id, 10.0), (ended.job_id, 11.0), (None, 12.0),
                               (later.job_id, 50.0))]
    for record in records:
        table.files.add_batch(record)
    assert [b.id for b in table.files.unfinished_batches(created_before=20.0)] == [records[0].id]
    assert table.files.batch_of_job("alice", running.job_id).id == records[0].id
    assert table.files.batch_of_job("bob", running.job_id) is None
    table.files.mark_expired(records[0].id, 15.0)
    table.files.mark_expired(records[0].id, 16.0)  # a later call changes nothing
    assert table.files.get_batch("alice", records[0].id).expired_at == 15.0


def batch_of(table, job_id: int | None, stored: int = 0, tenant: str = "alice") -> BatchRecord:
    return BatchRecord(new_batch_id(), tenant, job_id, "/v1/completions", "file-x", "24h", None, 1.0,
                       stored_bytes=stored)


def test_what_batches_store_counts_toward_the_quota_until_they_are_reclaimed(table):
    files = table.files
    files.add_file("alice", "batch", "in.jsonl", blob(1000), quota=5000)
    (job,) = table.catalog.submit([submission(3)])
    first = batch_of(table, job.job_id, 3000)
    files.add_batch(first, quota=5000)
    assert files.stored_bytes("alice") == 4000  # the upload and what the batch's rows hold
    with pytest.raises(FileQuotaExceeded, match="1 past its quota of 5,000 bytes") as refused:
        files.add_batch(batch_of(table, None, 1001), quota=5000)
    assert refused.value.what == "batch" and "max_file_bytes_per_tenant" in str(refused.value)
    assert [b.id for b in files.list_batches("alice", None, 10)] == [first.id]  # nothing stored
    with pytest.raises(FileQuotaExceeded):  # nor an upload past it
        files.add_file("alice", "batch", "more.jsonl", blob(1001), quota=5000)
    files.add_batch(batch_of(table, None, 1000, tenant="bob"), quota=1000)  # bob's are his own
    table.catalog.cancel_job(job.job_id)
    attached = files.attach_outputs(files.get_batch("alice", first.id), (200, 300))
    assert attached.stored_bytes == 3500 and files.stored_bytes("alice") == 4500  # outputs count too
    assert [b.id for b in files.reclaim_batches(ended_before=table.now() + 60)] == [first.id]
    assert files.stored_bytes("alice") == 1000  # reclaimed: no longer counted
    files.add_batch(batch_of(table, None, 4000), quota=5000)  # the room is back


def test_reclaiming_deletes_ended_batches_rows_in_pieces_and_keeps_their_records(table):
    catalog, files = table.catalog, table.files
    ended, running, recent = catalog.submit([submission(1203), submission(2), submission(2)])
    for job in (ended, recent):
        catalog.cancel_job(job.job_id)
    records = [batch_of(table, job.job_id) for job in (ended, running)] + [batch_of(table, None)]
    for record in records:
        files.add_batch(record)
    assert files.reclaim_batches(ended_before=0.0) == []  # none ended that long ago
    assert files.discard_job_rows(running.job_id) == 0  # a job not ended keeps its rows
    done = files.reclaim_batches(ended_before=table.now() + 60)
    assert [b.id for b in done] == [records[0].id] and done[0].reclaimed_at is not None
    assert catalog.request_progress(ended.job_id) == []
    assert list(catalog.iter_results(ended.job_id, errors=True)) == []
    (job,) = catalog.list_jobs(job_id=ended.job_id)
    assert job.state.value == "cancelled" and job.counts.num_requests == 1203  # counts kept
    assert job.counts.num_cancelled == 1203
    assert len(catalog.request_progress(running.job_id)) == 2  # not ended: kept
    assert len(catalog.request_progress(recent.job_id)) == 2  # no batch: not the batches' reclaim
    assert files.get_batch("alice", records[0].id).reclaimed_at == done[0].reclaimed_at
    assert files.reclaim_batches(ended_before=table.now() + 60) == []  # once
    assert files.discard_job_rows(recent.job_id) == 2 and catalog.request_progress(recent.job_id) == []
