"""A daemon's output into the job table, inside a write transaction: tokens so far, and completions.

Both are fenced: a row is written only while the writer holds its request
under the lease epoch the write names (a completion given no owner: while
the request has not ended). Neither moves its jobs' counters itself: each
adds what it changes to the transaction's `deltas`, which move once, at its
end (counters.move_jobs), with a claim's in the same transaction.

`careful`: each row under a savepoint of its own, so one whose output the
table refuses (storage/refusals.py) fails alone and the others are written;
tried after a transaction a refusal undid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Float, Integer, bindparam, column, func, select, update
from sqlalchemy.sql.selectable import TableValuedAlias

from fsched.core.ports.records import Completion, StoreError, TokenUpdate
from fsched.storage.counters import CountDelta
from fsched.storage.direct import DirectConnection, Ready, Tx
from fsched.storage.logprobs import append as append_logprobs
from fsched.storage.logprobs import new_piece
from fsched.storage.output import append as append_output
from fsched.storage.output import drop as drop_output_pieces
from fsched.storage.output import has_pieces
from fsched.storage.output import new_piece as new_output_piece
from fsched.storage.prepared import Batched, Prepared, listed, recordset
from fsched.storage.refusals import write_each
from fsched.storage.rows import RowState, requests, row_id, row_state

Deltas = dict[int, CountDelta]


def _row_updates(rows: TableValuedAlias, values: Callable[[Callable[[str], Any]], dict]) -> Batched:
    """An UPDATE of `requests` by id in both forms: a row's parameters (`each`), and every row of
    `rows` (`together`); `values(v)` is the SET clause, `v(name)` the value named `name` either way."""
    each = (update(requests).where(requests.c.id == bindparam("b_id"))
            .values(**values(lambda name: bindparam(name, type_=rows.c[name].type))))
    together = (update(requests).where(requests.c.id == rows.c.b_id)
                .values(**values(lambda name: rows.c[name])))
    return Batched(each, together)


_TOKENS = column("b_tokens", requests.c.output_tokens.type)
_TEXT = column("b_text", requests.c.output_text.type)
# A running request's output goes in pieces (storage/output.py): its row's write names only its counts.
_FLUSHED = recordset(column("b_id", requests.c.id.type), column("b_logprobs", Integer),
                     column("b_num", Integer), column("b_first", Float))
FLUSH_TOKENS = _row_updates(_FLUSHED, lambda v: dict(
    num_logprobs=v("b_logprobs"), num_output_tokens=v("b_num"),
    first_token_at=func.coalesce(requests.c.first_token_at, v("b_first")),
))
# A writer that does not know what the table holds (its first write after a claim), or whose output is not
# what the table holds followed by more tokens, writes the output whole into the row (its pieces go).
_FLUSHED_WHOLE = recordset(column("b_id", requests.c.id.type), _TOKENS, _TEXT, column("b_logprobs", Integer),
                           column("b_num", Integer), column("b_first", Float))
FLUSH_WHOLE = _row_updates(_FLUSHED_WHOLE, lambda v: dict(
    output_tokens=v("b_tokens"), output_text=v("b_text"), num_logprobs=v("b_logprobs"),
    num_output_tokens=v("b_num"), first_token_at=func.coalesce(requests.c.first_token_at, v("b_first")),
))
_FINISHED = recordset(column("b_id", requests.c.id.type), column("b_state", requests.c.state.type),
                      _TOKENS, _TEXT, column("b_logprobs", Integer), column("b_num", Integer),
                      column("b_reason", requests.c.finish_reason.type), column("b_prompt", Integer),
                      column("b_model", requests.c.model.type), column("b_error", requests.c.error.type),
                      column("b_now", Float), column("b_first", Float))
FINISH_REQUEST = _row_updates(_FINISHED, lambda v: dict(
    state=v("b_state"), output_tokens=v("b_tokens"), output_text=v("b_text"), num_logprobs=v("b_logprobs"),
    num_output_tokens=v("b_num"), finish_reason=v("b_reason"), prompt_tokens=v("b_prompt"),
    model=v("b_model"), error=v("b_error"), finished_at=v("b_now"), lease_owner=None, lease_expires_at=None,
    first_token_at=func.coalesce(requests.c.first_token_at, v("b_first")),
))
FAIL_REFUSED = Prepared(
    update(requests)
    .where(requests.c.id == bindparam("b_id"))
    .values(state=RowState.FAILED.value, error=bindparam("b_error", type_=requests.c.error.type),
            finished_at=bindparam("b_now", type_=Float), lease_owner=None, lease_expires_at=None)
)
HELD_ROWS = Prepared(lambda n: select(
    requests.c.id, requests.c.job_id, requests.c.num_output_tokens, requests.c.lease_epoch,
    requests.c.num_logprobs, has_pieces(requests.c.id),
).where(
    listed(requests.c.id, "b_ids", n),
    requests.c.lease_owner == bindparam("b_owner"),
    requests.c.state == RowState.RUNNING.value,
), listed="b_ids")
ENDING_ROWS = Prepared(lambda n: select(
    requests.c.id, requests.c.job_id, requests.c.state, requests.c.num_output_tokens, requests.c.lease_owner,
    requests.c.lease_epoch, requests.c.num_logprobs, has_pieces(requests.c.id),
).where(listed(requests.c.id, "b_ids", n)), listed="b_ids")


def write_tokens(tx: Tx, owner: str, updates: Sequence[TokenUpdate], careful: bool, deltas: Deltas,
                 now: float) -> int:
    """Write the updates `owner` may still write; how many it wrote. A request whose output the table
    refuses (careful only) ends `failed`, with why, its tokens as flushed before."""
    if not updates:
        return 0
    keys = [row_id(u.request_id) for u in updates]
    rows = {row.id: row for row in tx.rows(HELD_ROWS, {"b_ids": keys, "b_owner": owner})}
    counted, whole, pieces, outputs = [], [], {}, {}
    for u in updates:
        row = rows.get(row_id(u.request_id))
        if row is None or (u.lease_epoch is not None and row.lease_epoch != u.lease_epoch):
            continue  # fenced: the lease was lost (reclaimed, cancelled, requeued)
        pieces[row.id] = new_piece(row.id, row.num_logprobs, u.logprobs)
        write = {"b_id": row.id, "b_logprobs": max(row.num_logprobs, len(u.logprobs)), "b_num": len(u.tokens),
                 "b_first": u.first_token_at}
        if _appends(row.num_output_tokens, u):
            outputs[row.id] = new_output_piece(row.id, row.num_output_tokens, u.tokens, u.text, u.text_kept)
            counted.append(write)
        elif _unchanged(row.num_output_tokens, u):
            counted.append(write)
        else:
            whole.append(write | {"b_tokens": list(u.tokens), "b_text": u.text})
    drop_output_pieces(tx, [w["b_id"] for w in whole if rows[w["b_id"]].has_pieces])
    refused = {}
    if careful:
        refused = write_each(tx, FLUSH_TOKENS, counted, _piece_of(pieces, outputs))
        refused |= write_each(tx, FLUSH_WHOLE, whole, _piece_of(pieces))
    else:  # one statement (PostgreSQL) or executemany of each kind, not a statement per row
        tx.many(FLUSH_TOKENS, counted)
        tx.many(FLUSH_WHOLE, whole)
        append_logprobs(tx, pieces.values())
        append_output(tx, outputs.values())
    writes = counted + whole
    for w in writes:
        row = rows[w["b_id"]]
        delta = deltas.setdefault(row.job_id, CountDelta())
        if w["b_id"] in refused:
            delta.ended(RowState.RUNNING, RowState.FAILED, 0)
        else:
            delta.output_tokens += w["b_num"] - row.num_output_tokens
    tx.many(FAIL_REFUSED, [{"b_id": key, "b_error": why, "b_now": now} for key, why in refused.items()])
    return len(writes) - len(refused)


def completion_rows(direct: DirectConnection, completions: Sequence[Completion], now: float) -> Ready | None:
    """Where writers take turns (SQLite), the completions' rows in the driver's form (their tokens and
    text encoded), made before the write transaction begins: `write_completions` then writes those its
    fencing lets through. None elsewhere (PostgreSQL writes them as one statement)."""
    if not completions or not direct.one_writer:
        return None
    return direct.ready(FINISH_REQUEST, [_completion_write(c, 0, now) for c in completions])


def write_completions(tx: Tx, completions: Sequence[Completion], owner: str | None, careful: bool,
                      deltas: Deltas, now: float, ready: Ready | None = None) -> list[bool]:
    """End the requests the completions may end (fencing); for each, whether it was written. One whose
    output the table refuses (careful only) ends `failed` instead, with why. `ready`: their rows as
    `completion_rows` made them before the transaction."""
    if not completions:
        return []
    outcome, writes, ends, pieces, with_pieces = _completion_writes(tx, completions, owner, now)
    drop_output_pieces(tx, with_pieces)  # their rows hold it all now (a failed one: its tokens)
    if careful:
        refused = write_each(tx, FINISH_REQUEST, writes, _piece_of(pieces))
        writes = [_failed_write(w, refused[w["b_id"]], pieces.get(w["b_id"])) if w["b_id"] in refused
                  else w for w in writes]
        tx.many(FINISH_REQUEST, [w for w in writes if w["b_id"] in refused])
    else:
        if ready is None:
            tx.many(FINISH_REQUEST, writes)  # one statement (PostgreSQL) or executemany, not one a row
        else:
            kept = [row for row, written in zip(ready.rows, outcome, strict=True) if written]
            tx.many_ready(ready._replace(rows=ready.compiled.with_values(
                kept, "b_logprobs", [w["b_logprobs"] for w in writes])))
        append_logprobs(tx, pieces.values())
    for w, (job_id, previous, tokens_before) in zip(writes, ends, strict=True):
        deltas.setdefault(job_id, CountDelta()).ended(
            previous, RowState(w["b_state"]), w["b_num"] - tokens_before, w["b_prompt"])
    return outcome


def _completion_writes(
    tx: Tx, completions: Sequence[Completion], owner: str | None, now: float
) -> tuple[list[bool], list[dict], list[tuple[int, RowState, int]], dict[int, dict | None], list[int]]:
    """Which completions may be written (fencing), their rows, for each row its job, state
    and tokens before, the logprobs each appends, and those of them whose output has pieces."""
    keys = [row_id(c.request_id) for c in completions]
    rows = {row.id: row for row in tx.rows(ENDING_ROWS, {"b_ids": keys})}
    outcome, writes, ends, pieces = [], [], [], {}
    for key, c in zip(keys, completions, strict=True):
        row = rows.get(key)
        if row is None:
            raise StoreError(f"no request with id {c.request_id}")
        previous = RowState(row.state)
        fenced = owner is not None and (
            row.lease_owner != owner or (c.lease_epoch is not None and row.lease_epoch != c.lease_epoch)
        )
        outcome.append(not (previous.finished or fenced))
        if not outcome[-1]:
            continue
        pieces[key] = new_piece(key, row.num_logprobs, c.logprobs)
        writes.append(_completion_write(c, max(row.num_logprobs, len(c.logprobs)), now))
        ends.append((row.job_id, previous, row.num_output_tokens))
    return outcome, writes, ends, pieces, [w["b_id"] for w in writes if rows[w["b_id"]].has_pieces]


def _completion_write(c: Completion, logprobs: int, now: float) -> dict:
    """FINISH_REQUEST's parameters for a completion, its row holding `logprobs` logprobs after it."""
    return {
        "b_id": row_id(c.request_id), "b_state": row_state(c.status).value,
        "b_tokens": c.output_tokens, "b_text": c.output_text, "b_logprobs": logprobs,
        "b_num": len(c.output_tokens), "b_reason": c.status.finish_reason, "b_prompt": c.prompt_tokens,
        "b_model": c.model, "b_error": c.error, "b_now": now, "b_first": c.first_token_at,
    }


def _failed_write(write: dict, why: str, piece: dict | None) -> dict:
    """A completion the table refused, written failed instead: its tokens (integers) and why (the
    logprobs it would have appended are not)."""
    stored = write["b_logprobs"] if piece is None else piece["start"]
    return {**write, "b_state": RowState.FAILED.value, "b_text": "", "b_logprobs": stored,
            "b_reason": None, "b_error": why}


def _piece_of(pieces: Mapping[int, dict | None], outputs: Mapping[int, dict] | None = None):
    """What a write of one request appends besides its row: its new logprobs (and its output's piece)."""
    def appended(tx: Tx, write: dict) -> None:
        append_logprobs(tx, [pieces.get(write["b_id"])])
        if outputs is not None:
            append_output(tx, [outputs.get(write["b_id"])])
    return appended


def _appends(stored: int, update: TokenUpdate) -> bool:
    """Whether a flush writes the request's output as a piece (storage/output.py): the writer knows what the
    table holds and has more tokens than it."""
    return update.text_kept is not None and len(update.tokens) > stored


def _unchanged(stored: int, update: TokenUpdate) -> bool:
    """Whether the writer's output is the one the table holds (nothing of it to write)."""
    return update.text_kept == len(update.text) and len(update.tokens) == stored
