"""Output token ids as the table keeps them while a request runs: appended in pieces (`request_tokens`).

A running realtime or streaming request's tokens are written at every step.
Written as one value that every write replaced, a step's write cost in
proportion to the whole output so far: a request's writes grew with the
square of its length, and a long answer (thousands of tokens) made every
step of the daemon slow for every tenant. Here a write appends only the
tokens not stored yet (`requests.num_output_tokens` says how many are) as
one piece. A request's tokens are the row's `output_tokens` followed by its
pieces in order; the write that ends a request puts them all in the row and
drops its pieces, so an ended request is read from its row alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Connection, and_, bindparam, column, delete, or_, select

from fsched.storage.direct import Tx
from fsched.storage.models import RequestTokens
from fsched.storage.prepared import Batched, Prepared, listed, recordset

request_tokens = RequestTokens.__table__
READ_KEYS = 400  # request keys a statement names at once (SQLite binds at most 999 parameters a statement)


def new_piece(key: int, stored: int, tokens: Sequence[int]) -> dict | None:
    """The piece that appends `tokens[stored:]` to request `key`'s (None: nothing new)."""
    if len(tokens) <= stored:
        return None
    return {"request_id": key, "start": stored, "tokens": list(tokens[stored:])}


_PIECES = recordset(*(column(c.name, c.type) for c in (
    request_tokens.c.request_id, request_tokens.c.start, request_tokens.c.tokens)))
APPEND = Batched(
    request_tokens.insert().values(
        request_id=bindparam("request_id"), start=bindparam("start"), tokens=bindparam("tokens")),
    request_tokens.insert().from_select(["request_id", "start", "tokens"],
                                        select(_PIECES.c.request_id, _PIECES.c.start, _PIECES.c.tokens)),
)
PIECES_OF = Prepared(lambda n: select(request_tokens.c.request_id, request_tokens.c.tokens)
                     .where(listed(request_tokens.c.request_id, "b_keys", n))
                     .order_by(request_tokens.c.request_id, request_tokens.c.start), listed="b_keys")
DROP_PIECES = Prepared(lambda n: delete(request_tokens)
                       .where(listed(request_tokens.c.request_id, "b_keys", n)), listed="b_keys")


def append(tx: Tx, pieces: Iterable[dict | None]) -> None:
    """Store the pieces (one statement on PostgreSQL, one executemany elsewhere)."""
    tx.many(APPEND, [p for p in pieces if p is not None])


def drop(tx: Tx, keys: Sequence[int]) -> None:
    """Drop these requests' pieces (their rows now hold all their tokens)."""
    for at in range(0, len(keys), READ_KEYS):
        tx.run(DROP_PIECES, {"b_keys": list(keys[at : at + READ_KEYS])})


def in_pieces(rows: Iterable) -> list[int]:
    """The keys of the rows (with `id`, `output_tokens` and `num_output_tokens`) whose row holds only
    part of their tokens: the rest is in pieces."""
    return [row.id for row in rows if row.num_output_tokens > len(row.output_tokens or ())]


def read_whole(tx: Tx, keys: Sequence[int]) -> dict[int, list[int]]:
    """Each request's pieces' tokens, in order (in a daemon's transaction); a request with none is absent."""
    out: dict[int, list[int]] = {}
    for at in range(0, len(keys), READ_KEYS):
        for key, tokens in tx.rows(PIECES_OF, {"b_keys": list(keys[at : at + READ_KEYS])}):
            out.setdefault(key, []).extend(tokens)
    return out


def read(conn: Connection, keys: Sequence[int], since: Mapping[int, int] | None = None
         ) -> dict[int, list[int]]:
    """Each request's pieces' tokens (from the piece starting at token `since[key]` on, for the keys `since`
    names: a reader that holds the tokens before it), in order; a request with none is absent."""
    since = since or {}
    out: dict[int, list[int]] = {}
    for at in range(0, len(keys), READ_KEYS):
        part = keys[at : at + READ_KEYS]
        whole = [k for k in part if k not in since]
        wanted = [request_tokens.c.request_id.in_(whole)] if whole else []
        wanted += [and_(request_tokens.c.request_id == k, request_tokens.c.start >= since[k])
                   for k in part if k in since]
        rows = conn.execute(select(request_tokens.c.request_id, request_tokens.c.tokens).where(or_(*wanted))
                            .order_by(request_tokens.c.request_id, request_tokens.c.start))
        for key, tokens in rows:
            out.setdefault(key, []).extend(tokens)
    return out


def whole_tokens(row, pieces: Mapping[int, list[int]]) -> tuple[int, ...]:
    """A request's tokens: its row's, then its pieces'."""
    stored = row.output_tokens or ()
    more = pieces.get(row.id)
    return (*stored, *more) if more else tuple(stored)
