"""A running request's output in the SQL job table: each write appends only what the table does not hold
yet (the tokens after those stored, the text after what the writer says the table holds), in a piece of its
own, so a step's write does not grow with the output so far (a realtime or streaming request's output is
written at every step; a reasoning model's answer runs to thousands of tokens). Every reader (a claim that
resumes, the server's polls, results, progress) reads a request's row and its pieces as one output; the
write that ends a request puts it all in its row."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text

from fsched.core.daemon.writer import kept_of
from fsched.core.ports.records import Completion, JobSubmission, TokenUpdate
from fsched.core.types import Endpoint, RequestClass, RequestSpec, RequestStatus, SamplingParams
from fsched.storage import schema
from fsched.storage.jobstore import SqlJobStore
from fsched.storage.output import request_output
from fsched.storage.rows import requests
from fsched.storage.sql_serving import SqlServingStore

LONG = 3_000


@pytest.fixture
def store(db_url):
    WRITTEN.clear()
    store = SqlJobStore(db_url)
    yield store
    store.db.dispose()


def streamed(n: int = 1) -> JobSubmission:
    specs = tuple(RequestSpec(custom_id=f"c{i}", endpoint=Endpoint.COMPLETIONS, prompt="p",
                              params=SamplingParams(max_tokens=100_000)) for i in range(n))
    return JobSubmission(specs, "alice", RequestClass.STREAMING, 5, "chat")


WRITTEN: dict = {}  # the text each request's last write left in the table, as a daemon's writer keeps it


def grow(store, request, tokens: list[int], owner: str = "d1", text: str | None = None) -> None:
    """One step's write of a held request whose output is now `tokens` (and `text`), saying, as a
    daemon does, how much of the text its last write left in the table."""
    text = text_of(tokens) if text is None else text
    update = TokenUpdate(request.id, tuple(tokens), text, 1.0, request.lease_epoch,
                         text_kept=kept_of(WRITTEN.get((owner, request.id)), text))
    assert store.flush_tokens(owner, [update]) == 1
    WRITTEN[(owner, request.id)] = text


def text_of(tokens: list[int]) -> str:
    return "".join(f"w{t} " for t in tokens)


def stored(store, key) -> tuple[list, str, list[tuple[int, list, int, str]]]:
    """The request's row's tokens and text and its pieces (start, tokens, text kept, text), as the table
    holds them."""
    with store.db.read() as conn:
        tokens, text = conn.execute(select(requests.c.output_tokens, requests.c.output_text)
                                    .where(requests.c.id == int(key))).one()
        pieces = conn.execute(select(request_output.c.start, request_output.c.tokens,
                                     request_output.c.text_kept, request_output.c.text)
                              .where(request_output.c.request_id == int(key))
                              .order_by(request_output.c.start)).all()
    return list(tokens), text, [(start, list(more), kept, piece) for start, more, kept, piece in pieces]


def test_each_write_appends_only_what_the_table_does_not_hold_yet(store):
    (job,) = store.submit([streamed()])
    (held,) = store.claim("d1", per_group=5)
    output = list(range(LONG))
    grow(store, held, output)  # the writer's first write after its claim: whole, in the row
    for more in range(3):
        output.append(50_000 + more)
        grow(store, held, output)
    grow(store, held, output)  # nothing new: no piece
    row_tokens, row_text, pieces = stored(store, held.id)
    assert row_tokens == list(range(LONG)) and row_text == text_of(list(range(LONG)))
    kept = len(row_text)
    assert pieces == [(LONG + i, [50_000 + i], kept + i * 7, f"w{50_000 + i} ") for i in range(3)]
    (progress,) = store.request_progress(job.job_id)
    assert list(progress.tokens) == output and progress.num_output_tokens == len(output)
    assert progress.output_text == text_of(output)


def test_a_piece_can_change_the_last_characters_written(store):
    """A character whose bytes had not all come was written as U+FFFD; the next write replaces it."""
    (job,) = store.submit([streamed()])
    (held,) = store.claim("d1", per_group=5)
    grow(store, held, [1, 2], text="ab")
    grow(store, held, [1, 2, 3], text="ab\ufffd")
    grow(store, held, [1, 2, 3, 4], text="ab\u00e9!")
    (progress,) = store.request_progress(job.job_id)
    assert progress.output_text == "ab\u00e9!" and list(progress.tokens) == [1, 2, 3, 4]
    assert stored(store, held.id)[2] == [(2, [3], 2, "\ufffd"), (3, [4], 2, "\u00e9!")]


def test_a_resume_a_result_and_the_servers_polls_read_the_row_and_its_pieces_as_one(store):
    (job,) = store.submit([streamed(2)])
    a, b = sorted(store.claim("d1", per_group=5), key=lambda r: r.custom_id)
    serving = SqlServingStore(store.db)
    output = [7, 8, 9]
    grow(store, a, output)
    seen = []
    for step in range(5):  # the server polls between writes: each poll reads only the pieces it lacks
        output.append(100 + step)
        grow(store, a, output)
        (first, _) = serving.progress([job.job_id])[job.job_id]
        seen.append(list(first.tokens))
    assert seen == [output[:4 + i] for i in range(5)]
    store.release("d1")  # the daemon stops: the next claim resumes from the table
    again = {r.custom_id: r for r in store.claim("d2", per_group=5)}
    assert list(again["c0"].output) == output and list(again["c1"].output) == []
    ended = [*output, 555]
    assert store.finish_requests([Completion(again["c0"].id, RequestStatus.FINISHED_STOPPED, tuple(ended),
                                             text_of(ended), 1, lease_epoch=again["c0"].lease_epoch)], "d2")
    assert stored(store, again["c0"].id) == (ended, text_of(ended), [])  # all in its row, no pieces
    (first, _) = serving.progress([job.job_id])[job.job_id]
    assert list(first.tokens) == ended and first.status.is_finished
    assert list({r.custom_id: r for r in store.iter_results(job.job_id)}["c0"].output_tokens) == ended


def test_an_online_request_resumes_from_its_row_and_its_pieces(store):
    """A job of one request (every online request) is leased by the claim's one update for such jobs,
    its values read after the commit: one that ran before resumes with its output, pieces included."""
    (job,) = store.submit([streamed()])
    (fresh,) = store.submit([streamed()])
    (held, other) = sorted(store.claim("d1", per_group=5), key=lambda r: r.job_id)
    output = list(range(40))
    grow(store, held, output)
    for step in range(3):
        output.append(900 + step)
        grow(store, held, output)
    assert len(stored(store, held.id)[2]) == 3  # the last three tokens in pieces
    store.release("d1")
    again = {r.job_id: r for r in store.claim("d2", per_group=5)}
    assert list(again[job.job_id].output) == output and list(again[fresh.job_id].output) == []
    assert again[job.job_id].lease_epoch == held.lease_epoch + 1 and other.job_id == fresh.job_id


def test_a_holder_with_fewer_tokens_than_stored_writes_them_whole(store):
    (job,) = store.submit([streamed()])
    (held,) = store.claim("d1", per_group=5)
    grow(store, held, [1, 2])
    grow(store, held, [1, 2, 3, 4])
    grow(store, held, [1, 2])
    assert stored(store, held.id) == ([1, 2], text_of([1, 2]), [])
    grow(store, held, [1, 2, 5])
    (progress,) = store.request_progress(job.job_id)
    assert list(progress.tokens) == [1, 2, 5] and progress.num_output_tokens == 3
    assert progress.output_text == text_of([1, 2, 5])


def test_a_cancelled_request_keeps_the_tokens_of_its_pieces(store):
    (job,) = store.submit([streamed()])
    (held,) = store.claim("d1", per_group=5)
    grow(store, held, [4])
    grow(store, held, [4, 5, 6])
    store.release("d1")  # back in the queue with its output, then cancelled there
    store.cancel_job(job.job_id)
    (result,) = store.iter_results(job.job_id, errors=True)
    assert result.status.is_finished and list(result.output_tokens) == [4, 5, 6]
    assert result.output_text == text_of([4, 5, 6])


def test_a_version_12_table_gains_the_pieces_and_keeps_its_rows(store):
    (job,) = store.submit([streamed()])
    (held,) = store.claim("d1", per_group=5)
    assert store.finish_requests([Completion(held.id, RequestStatus.FINISHED_STOPPED, (3, 4), "w3 w4 ", 1,
                                             lease_epoch=held.lease_epoch)], "d1")
    with store.db.write() as conn:  # as a version-12 table: no pieces
        conn.execute(text("DROP TABLE request_output"))
        conn.execute(text("UPDATE fsched_meta SET value = '12' WHERE key = 'schema_version'"))
    assert schema.ensure_schema(store.db) == 12
    (result,) = store.iter_results(job.job_id)
    assert list(result.output_tokens) == [3, 4]
    (more,) = store.submit([streamed()])
    (again,) = store.claim("d1", per_group=5)
    grow(store, again, [9])
    grow(store, again, [9, 9, 9])
    assert stored(store, again.id) == ([9], "w9 ", [(1, [9, 9], 3, "w9 w9 ")])


def test_pieces_that_do_not_follow_on_are_not_applied(store):
    """On PostgreSQL a reader's row and pieces are two statements: a row read before a daemon wrote the
    output whole, and the pieces after, do not follow on; the reader shows the row alone until it reads
    the row again."""
    from fsched.storage.output import Output

    read = Output([1, 2], "ab", end=2)
    read.apply(5, [6], 5, "f")  # tokens 2-4 are missing: written whole into the row since
    assert read.broken
    (job,) = store.submit([streamed()])
    (held,) = store.claim("d1", per_group=5)
    serving = SqlServingStore(store.db)
    grow(store, held, [1])
    grow(store, held, [1, 2])
    (progress,) = serving.progress([job.job_id])[job.job_id]
    assert list(progress.tokens) == [1, 2]
    store.release("d1")
    (again,) = store.claim("d2", per_group=5)  # another daemon: its first write is whole, then a piece
    grow(store, again, [1, 2, 3, 4], owner="d2")
    grow(store, again, [1, 2, 3, 4, 5], owner="d2")
    (progress,) = serving.progress([job.job_id])[job.job_id]
    assert list(progress.tokens) == [1, 2, 3, 4, 5] and progress.output_text == text_of([1, 2, 3, 4, 5])
