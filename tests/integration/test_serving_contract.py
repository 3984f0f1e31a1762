"""The ServingStore contract, one set of tests run on every implementation: in memory, SQLite, PostgreSQL.

The HTTP server's reads: every open request's progress in one read (logprobs
and token ids included), the per-tenant totals behind `/metrics`, and the
first-token latencies of a recent window.
"""

from __future__ import annotations

import pytest

from fsched.core.ports.records import Completion, JobSubmission, TokenUpdate
from fsched.core.ports.serving import ServingStore
from fsched.core.types import (
    Endpoint,
    Logprob,
    RequestClass,
    RequestSpec,
    RequestStatus,
    SamplingParams,
    TokenLogprobs,
)
from tests.support.store import finish
from tests.support.tables import KINDS, open_table, submission


@pytest.fixture(params=KINDS)
def table(request):
    made = open_table(request, request.param)
    yield made
    made.close()


def test_it_is_a_serving_store(table):
    assert isinstance(table.serving, ServingStore)


def test_tenant_totals_count_prompt_tokens_and_outcomes_for_chargeback(table):
    store, queue = table.catalog, table.queue
    store.submit([submission(3, "alice")])
    store.submit([submission(1, "bob", RequestClass.REALTIME)])
    claimed = queue.claim("d", per_group=5)
    assert len(claimed) == 4
    a = [c for c in claimed if c.tenant == "alice"]
    finish(queue, a[0].id, RequestStatus.FINISHED_LENGTH, [1, 2, 3], "abc", prompt_tokens=7)
    finish(queue, a[1].id, RequestStatus.FINISHED_FAILED, error="boom")
    finish(queue, a[2].id, RequestStatus.FINISHED_STOPPED, [4], "d", prompt_tokens=5)
    totals = {(t.tenant, t.request_class): t for t in table.serving.tenant_totals()}
    alice = totals["alice", RequestClass.BATCH]
    assert (alice.generated_tokens, alice.prompt_tokens, alice.done, alice.failed, alice.cancelled) == \
        (4, 12, 2, 1, 0)
    bob = totals["bob", RequestClass.REALTIME]
    assert (bob.generated_tokens, bob.prompt_tokens, bob.done) == (0, 0, 0)


def test_first_tokens_read_only_the_window(table):
    table.catalog.submit([submission(3, "alice", RequestClass.STREAMING)])
    first, second, third = table.queue.claim("d", per_group=5)
    enqueued = first.enqueued_at
    table.queue.flush_tokens("d", [TokenUpdate(first.id, (1,), "a", first_token_at=enqueued + 0.25),
                                   TokenUpdate(second.id, (1,), "a", first_token_at=enqueued + 5.0),
                                   TokenUpdate(third.id, (1,), "a", first_token_at=enqueued + 6.0)])
    serving = table.serving
    recent = serving.first_tokens(enqueued + 1.0)[RequestClass.STREAMING]
    assert (recent.count, recent.p50_s, recent.p99_s) == (2, pytest.approx(5.5), pytest.approx(5.99))
    assert serving.first_tokens(0.0)[RequestClass.STREAMING].p50_s == pytest.approx(5.0)
    assert serving.first_tokens(enqueued + 10) == {}


def test_progress_reads_every_asked_job_at_once_as_it_goes(table):
    a, b = (table.catalog.submit([submission(1, tenant)])[0].job_id for tenant in ("alice", "bob"))
    assert set(table.serving.progress([a, b, 999])) == {a, b}  # a job with no row is absent
    assert table.serving.progress([]) == {}
    claimed = {c.job_id: c for c in table.queue.claim("d", per_group=5)}
    table.queue.flush_tokens("d", [TokenUpdate(claimed[a].id, (4, 5), "w4 w5", first_token_at=2.0)])
    (mid,) = table.serving.progress([a])[a]
    assert (mid.status, mid.output_text, mid.num_output_tokens, mid.tokens, mid.first_token_at) == (
        RequestStatus.RUNNING, "w4 w5", 2, (4, 5), 2.0)
    finish(table.queue, claimed[a].id, RequestStatus.FINISHED_STOPPED, (4, 5, 6), "w4 w5 w6", 3, "tiny")
    (end,) = table.serving.progress([a])[a]
    assert (end.status, end.finish_reason, end.prompt_tokens, end.model, end.id) == (
        RequestStatus.FINISHED_STOPPED, "stop", 3, "tiny", claimed[a].id)
    assert end.finished_at is not None and end.first_token_at == 2.0



def test_progress_states_answer_as_progress_does_without_texts(table):
    a, b = (table.catalog.submit([submission(n, "alice")])[0].job_id for n in (1, 2))
    claimed = {c.job_id: c for c in table.queue.claim("d", per_group=5) if c.job_id == a}
    table.queue.flush_tokens("d", [TokenUpdate(claimed[a].id, (4, 5), "w4 w5", first_token_at=2.0)])
    assert table.serving.progress_states([a, b, 999]) == {
        a: ((RequestStatus.RUNNING, 2),), b: ((RequestStatus.RUNNING, 0), (RequestStatus.RUNNING, 0))}
    assert table.serving.progress_states([]) == {}
    finish(table.queue, claimed[a].id, RequestStatus.FINISHED_STOPPED, (4, 5, 6), "w4 w5 w6", 3, "tiny")
    assert table.serving.progress_states([a]) == {a: ((RequestStatus.FINISHED_STOPPED, 3),)}
    assert table.serving.progress_states([a])[a] == tuple(
        (p.status, p.num_output_tokens) for p in table.serving.progress([a])[a])


def test_progress_states_show_a_cancel_whatever_the_number_of_jobs_asked(table):
    jobs = [job.job_id for job in table.catalog.submit([submission(1, "alice") for _ in range(70)])]
    table.cancel(jobs[4])
    for n in (1, 2, 3, 5, 8, 9, 70):  # 70: past the 50 parameters the driver keeps a statement's form for
        asked = jobs[:n] if n > 4 else jobs[:n - 1] + [jobs[4]]
        states = table.serving.progress_states(asked)
        assert set(states) == set(asked)
        assert states[jobs[4]] == ((RequestStatus.FINISHED_CANCELLED, 0),)
        assert all(states[j] == ((RequestStatus.WAITING, 0),) for j in asked if j != jobs[4])


def test_a_states_read_is_one_statement_with_no_transaction_around_it(request):
    """The server checks its linked streams' states several times a second: one SELECT on a driver
    connection, not a BEGIN, the SELECT and a COMMIT (what those cost was most of an idle server's CPU)."""
    from sqlalchemy import event

    table = open_table(request, "sqlite")
    jobs = [table.submit(1) for _ in range(3)]
    table.cancel(jobs[1])
    statements: list[str] = []

    @event.listens_for(table.db.engine, "connect")
    def trace(dbapi_connection, _record) -> None:
        dbapi_connection.set_trace_callback(statements.append)

    table.db.engine.dispose()  # the connections made so far go: the next one is traced
    assert table.serving.progress_states(jobs)[jobs[1]] == ((RequestStatus.FINISHED_CANCELLED, 0),)
    assert len(statements) == 1 and statements[0].startswith("SELECT")


def records(tokens: list[int]) -> tuple[TokenLogprobs, ...]:
    out = []
    for i, t in enumerate(tokens):
        chosen = Logprob(t, -0.5 * i, f"w{t}")
        out.append(TokenLogprobs(chosen, (chosen, Logprob(1, -9999.0, "\ufffd"))))
    return tuple(out)


def with_logprobs(logprobs: int | None) -> JobSubmission:
    specs = tuple(RequestSpec(custom_id=f"c{i}", endpoint=Endpoint.COMPLETIONS, prompt="p",
                              params=SamplingParams(max_tokens=8, logprobs=logprobs)) for i in range(2))
    return JobSubmission(tuple(specs), "alice", RequestClass.BATCH, 5, "job")


def test_flushed_logprobs_come_back_with_the_tokens_on_a_resume_and_in_every_read(table):
    store, queue = table.catalog, table.queue
    (job,) = store.submit([with_logprobs(2)])
    a, b = queue.claim("d1", per_group=5)
    assert tuple(a.resumed_logprobs) == () and a.params.logprobs == 2
    assert queue.flush_tokens("d1", [TokenUpdate(a.id, (4, 5), "w4 w5", 1.0, a.lease_epoch,
                                                 records([4, 5]))]) == 1
    queue.release("d1")  # a daemon stops: the next claim resumes from the table
    again = {c.id: c for c in queue.claim("d2", per_group=5)}
    assert again[a.id].resumed == [4, 5] and tuple(again[a.id].resumed_logprobs) == records([4, 5])
    assert tuple(again[b.id].resumed_logprobs) == ()
    final = Completion(a.id, RequestStatus.FINISHED_STOPPED, (4, 5, 6), "w4 w5 w6", 1, "m",
                       lease_epoch=again[a.id].lease_epoch, logprobs=records([4, 5, 6]))
    assert queue.finish_requests([final], "d2") == [True]
    results = {r.custom_id: r for r in store.iter_results(job.job_id)}
    assert results["c0"].logprobs == records([4, 5, 6])
    progress = table.serving.progress([job.job_id])[job.job_id][0]  # the first row
    assert progress.logprobs == records([4, 5, 6])
