"""The claim of jobs of one request (every online request): on PostgreSQL its write in one round trip
(storage/claim.py `claim_at_once`), held to what the general claim does, on every kind of table."""

from __future__ import annotations

import threading

import pytest

from fsched.core.jobs.jobstate import JobState
from fsched.core.ports.queue import ClaimAsk
from fsched.core.ports.records import TokenUpdate
from fsched.core.types import RequestClass, RequestStatus
from tests.support.store import finish
from tests.support.tables import KINDS, open_table


@pytest.fixture(params=KINDS)
def table(request):
    made = open_table(request, request.param)
    yield made
    made.close()


@pytest.fixture
def pg(request):
    made = open_table(request, "postgresql")
    yield made
    made.close()


def _job(table, job_id: int):
    (job,) = table.catalog.list_jobs(job_id)
    return job


def test_jobs_of_one_are_leased_with_their_counters_moved_and_the_groups_room_kept(table):
    q = table.queue
    alice = [table.submit(1, "alice", RequestClass.REALTIME) for _ in range(3)]
    bob = table.submit(1, "bob", RequestClass.STREAMING)
    claimed = q.claim("d1", per_group=2, announced=True)
    assert [c.job_id for c in claimed] == [*alice[:2], bob]  # each group's room, in the claim's order
    assert [(c.tenant, c.request_class, c.lease_epoch, c.attempts) for c in claimed] == [
        ("alice", RequestClass.REALTIME, 1, 1), ("alice", RequestClass.REALTIME, 1, 1),
        ("bob", RequestClass.STREAMING, 1, 1)]
    for job_id in (*alice[:2], bob):
        job = _job(table, job_id)
        assert (job.state, job.counts.num_running) == (JobState.IN_PROGRESS, 1)
        assert job.started_at is not None
    waiting = _job(table, alice[2])
    assert (waiting.state, waiting.counts.num_running, waiting.started_at) == (JobState.QUEUED, 0, None)
    held = {("alice", RequestClass.REALTIME): 2, ("bob", RequestClass.STREAMING): 1}
    assert q.claim("d2", per_group=2, held=held, announced=True) == []  # no room left in either group
    (last,) = q.claim("d2", per_group=3, held=held, announced=True)
    assert last.job_id == alice[2]
    assert q.claim("d2", per_group=9) == []  # nothing queued: nothing written either
    # The claimed rows are the claimer's: its tokens and its end are written, the job ends done.
    assert q.flush_tokens("d1", [TokenUpdate(claimed[0].id, (4, 5), "ab", lease_epoch=1)]) == 1
    assert finish(q, claimed[0].id, RequestStatus.FINISHED_STOPPED, (4, 5, 6), "abc", owner="d1",
                  lease_epoch=1)
    done = _job(table, alice[0])
    assert (done.state, done.counts.num_running, done.counts.num_done) == (JobState.COMPLETED, 0, 1)


def test_a_resumed_job_of_one_comes_back_with_its_tokens(table):
    q = table.queue
    job_id = table.submit(1, "alice", RequestClass.REALTIME)
    (first,) = q.claim("d1", per_group=4, announced=True)
    assert q.flush_tokens("d1", [TokenUpdate(first.id, (7, 8, 9), "xyz", lease_epoch=1)]) == 1
    assert q.release("d1") == 1
    assert _job(table, job_id).counts.num_running == 0
    (again,) = q.claim("d2", per_group=4, announced=True)
    assert (again.id, again.lease_epoch, again.attempts, again.resumed) == (first.id, 2, 2, [7, 8, 9])
    assert _job(table, job_id).counts.num_running == 1
    assert q.flush_tokens("d1", [TokenUpdate(first.id, (10,), "w", lease_epoch=1)]) == 0  # the old lease


def test_on_postgresql_the_claim_of_jobs_of_one_writes_in_one_transaction_of_one_query(pg, monkeypatch):
    """The claim reads the jobs with work alone and writes once (`write_once`), never through a
    transaction of several round trips; one that takes part of a bigger job goes the general way."""
    from fsched.storage.direct import DirectConnection

    q = pg.queue
    for _ in range(3):
        pg.submit(1, "alice", RequestClass.REALTIME)
    calls = {"write_once": 0, "write": 0}
    once, write = DirectConnection.write_once, DirectConnection.write

    def counted_once(self, *args, **kwargs):
        calls["write_once"] += 1
        return once(self, *args, **kwargs)

    def counted_write(self, *args, **kwargs):
        calls["write"] += 1
        return write(self, *args, **kwargs)

    monkeypatch.setattr(DirectConnection, "write_once", counted_once)
    monkeypatch.setattr(DirectConnection, "write", counted_write)
    assert len(q.write_step("d1", (), (), ClaimAsk(per_group=8, held={})).claimed) == 3
    assert calls == {"write_once": 1, "write": 0}
    pg.submit(3, "alice", RequestClass.BATCH)
    assert len(q.claim("d1", per_group=2, announced=True)) == 2  # two of a job of three
    assert calls == {"write_once": 1, "write": 1}


def test_on_postgresql_a_dropped_prepared_statement_is_prepared_again(pg):
    """A rollback on the daemon's connection drops the session's prepared statements (the driver answers
    it with DEALLOCATE ALL): the next claim prepares its statement again."""
    q = pg.queue
    pg.submit(1, "alice", RequestClass.REALTIME)
    assert len(q.claim("d1", per_group=4, announced=True)) == 1
    with q.direct.read() as tx:
        tx._cursor.execute("DEALLOCATE ALL")
    with pytest.raises(Exception):  # noqa: B017 - any failure: the point is the rollback after it
        with q.direct.write() as tx:
            tx._cursor.execute("SELECT 1 / 0")
    pg.submit(1, "alice", RequestClass.REALTIME)
    assert len(q.claim("d1", per_group=4, announced=True)) == 1


def test_on_postgresql_daemons_claiming_together_lease_each_job_of_one_once(pg):
    """Four daemons claim 400 online jobs at once: every job is leased once, by one daemon, and each
    job's counters say so (the rows another daemon took are skipped, not waited for, and their jobs
    not moved)."""
    job_ids = [job.job_id for job in pg.catalog.submit([_one(i) for i in range(400)])]
    owners = [f"d{i}" for i in range(4)]
    got: dict[str, list] = {owner: [] for owner in owners}
    errors: list[BaseException] = []
    start = threading.Barrier(len(owners), timeout=60)

    def claim(owner: str) -> None:
        other = pg.another()
        try:
            other.queue.claim(owner, per_group=0, announced=True)  # its connection open: none waits for one
            start.wait()
            for _ in range(200):  # a job of each of the 8 tenants a claim: 50 claims among the four
                got[owner] += other.queue.claim(owner, per_group=1, announced=True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=claim, args=(owner,)) for owner in owners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    leased = [c.job_id for owner in owners for c in got[owner]]
    assert sorted(leased) == sorted(job_ids)
    assert sum(1 for owner in owners if got[owner]) > 1  # they did claim together
    summaries = pg.catalog.list_jobs()
    assert {(j.state, j.counts.num_running) for j in summaries if j.id in set(job_ids)} == {
        (JobState.IN_PROGRESS, 1)}


def _one(i: int):
    from tests.support.tables import submission

    return submission(1, f"t{i % 8}", RequestClass.REALTIME)


def test_on_postgresql_a_session_that_loses_its_statements_without_a_rollback_gets_them_as_text(pg):
    """A pooler in transaction mode gives each transaction another session: the statement prepared on one
    is not there on the next. The claim that finds it gone is sent again as text, and so are the later."""
    q = pg.queue
    pg.submit(1, "alice", RequestClass.REALTIME)
    assert len(q.claim("d1", per_group=4, announced=True)) == 1
    with q.direct.read() as tx:
        tx._cursor.execute("DEALLOCATE ALL")  # gone, and no rollback said so
    pg.submit(1, "alice", RequestClass.REALTIME)
    assert len(q.claim("d1", per_group=4, announced=True)) == 1
    pg.submit(1, "alice", RequestClass.REALTIME)
    assert len(q.claim("d1", per_group=4, announced=True)) == 1
    assert q.direct._by_name_ok is False
