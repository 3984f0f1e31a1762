"""A table of many finished jobs costs an online request and a status nothing more: every streamed chat is a
job of its own, so a server that has answered a million of them holds a million finished jobs. The group
commit's count of a tenant's unfinished work, and the listings of unfinished jobs and of tenants, read the
unfinished jobs alone (by the state's index), counted here in SQLite's own virtual-machine instructions."""

from __future__ import annotations

from sqlalchemy import event, text

from fsched.core.ports.records import JobSubmission
from fsched.core.types import JobOrigin, RequestClass
from fsched.storage.sql_catalog import SqlCatalogStore
from tests.support.tables import submission

FINISHED = 3_000


class Steps:
    """SQLite's instructions run on every connection the store opens from now on."""

    def __init__(self, store: SqlCatalogStore) -> None:
        self.count = 0
        store.db.engine.dispose()  # those opened so far are not counted
        event.listen(store.db.engine, "connect",
                     lambda raw, _record: raw.set_progress_handler(self._step, 10))

    def _step(self) -> int:
        self.count += 10
        return 0  # go on

    def of(self, call) -> int:
        before = self.count
        call()
        return self.count - before


def online(tenant: str = "carol") -> JobSubmission:
    one = submission(1, tenant)
    return JobSubmission(one.requests, tenant, RequestClass.REALTIME, 5, "chat", JobOrigin.ONLINE)


def finish_many(store: SqlCatalogStore, tenant: str, n: int) -> None:
    """`n` finished one-request jobs of `tenant`, as a day of streamed chats leaves them."""
    with store.db.write() as conn:
        conn.execute(text(
            "INSERT INTO jobs (tenant, class, priority, name, origin, state, num_requests, num_done,"
            " num_failed, num_cancelled, num_running, num_output_tokens, num_prompt_tokens, submitted_at)"
            " VALUES (:tenant, 'realtime', 5, 'chat', 'online', 'completed', 1, 1, 0, 0, 0, 4, 8, 0)"),
            [{"tenant": tenant}] * n)


def test_finished_jobs_are_not_read_by_the_online_path_or_status(tmp_path):
    store = SqlCatalogStore(f"sqlite:///{tmp_path}/t.db")
    steps = Steps(store)
    store.submit_each([online()])  # the tenant made, the statements compiled, the connections opened
    store.submit([submission(2, "carol")])  # and an unfinished batch job beside the online ones
    calls = {
        "group commit": lambda: store.submit_each([online()]),
        "unfinished jobs": lambda: store.list_jobs(include_finished=False),
        "the newest finished": lambda: store.list_jobs(finished_limit=10),
        "tenants": lambda: store.list_tenants(),
    }
    before = {name: steps.of(call) for name, call in calls.items()}
    finish_many(store, "carol", FINISHED)
    after = {name: steps.of(call) for name, call in calls.items()}
    # Reading the finished jobs would cost instructions for each of them (3,000 x several); the calls
    # after are the calls before plus the one more unfinished job each group commit stored.
    for name in calls:
        assert after[name] < before[name] + 2 * FINISHED, (name, before[name], after[name])
    assert not [job for job in store.list_jobs(include_finished=False) if job.state.finished]
    assert sum(t.active_jobs for t in store.list_tenants() if t.name == "carol") == 4
