"""Output logprobs as the table keeps them: appended in pieces (`request_logprobs`), never rewritten.

A write of a request's tokens appends the records of its tokens not stored
yet (`requests.num_logprobs` says how many are) as one piece; a reader reads
a request's pieces whole, or only those from a record on (the HTTP server's
poll, which already holds the others). Writing and reading a request's
logprobs thus cost their size once, however many flushes and polls it takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Connection, and_, bindparam, column, or_, select

from fsched.core.types import TokenLogprobs
from fsched.storage.direct import Tx
from fsched.storage.models import RequestLogprobs
from fsched.storage.prepared import Batched, Prepared, listed, recordset

request_logprobs = RequestLogprobs.__table__
READ_KEYS = 400  # request keys a read names at once (SQLite binds at most 999 parameters a statement)


def new_piece(key: int, stored: int, logprobs: Sequence[TokenLogprobs]) -> dict | None:
    """The piece that appends `logprobs[stored:]` to request `key`'s (None: nothing new)."""
    if len(logprobs) <= stored:
        return None
    return {"request_id": key, "start": stored, "records": [t.to_json() for t in logprobs[stored:]]}


_PIECES = recordset(*(column(c.name, c.type) for c in (
    request_logprobs.c.request_id, request_logprobs.c.start, request_logprobs.c.records)))
APPEND = Batched(
    request_logprobs.insert().values(
        request_id=bindparam("request_id"), start=bindparam("start"), records=bindparam("records")),
    request_logprobs.insert().from_select(["request_id", "start", "records"],
                                          select(_PIECES.c.request_id, _PIECES.c.start, _PIECES.c.records)),
)
PIECES_OF = Prepared(lambda n: select(request_logprobs.c.request_id, request_logprobs.c.records)
                     .where(listed(request_logprobs.c.request_id, "b_keys", n))
                     .order_by(request_logprobs.c.request_id, request_logprobs.c.start), listed="b_keys")


def append(tx: Tx, pieces: Iterable[dict | None]) -> None:
    """Store the pieces (one statement on PostgreSQL, one executemany elsewhere)."""
    tx.many(APPEND, [p for p in pieces if p is not None])


def read_whole(tx: Tx, keys: Sequence[int]) -> dict[int, tuple[TokenLogprobs, ...]]:
    """Each request's logprobs, whole (`read` without `since`, in a daemon's transaction)."""
    out: dict[int, list[TokenLogprobs]] = {}
    for at in range(0, len(keys), READ_KEYS):
        for key, records in tx.rows(PIECES_OF, {"b_keys": list(keys[at : at + READ_KEYS])}):
            out.setdefault(key, []).extend(TokenLogprobs.from_json(r) for r in records)
    return {key: tuple(records) for key, records in out.items()}


def read(conn: Connection, keys: Sequence[int], since: Mapping[int, int] | None = None
         ) -> dict[int, tuple[TokenLogprobs, ...]]:
    """Each request's logprobs (from record `since[key]` on, for the keys `since` names: pieces start
    where a reader's last read ended), in order; a request with none is absent."""
    since = since or {}
    out: dict[int, list[TokenLogprobs]] = {}
    for at in range(0, len(keys), READ_KEYS):
        part = keys[at : at + READ_KEYS]
        whole = [k for k in part if not since.get(k)]
        wanted = [request_logprobs.c.request_id.in_(whole)] if whole else []
        wanted += [and_(request_logprobs.c.request_id == k, request_logprobs.c.start >= since[k])
                   for k in part if since.get(k)]
        rows = conn.execute(select(request_logprobs.c.request_id, request_logprobs.c.records)
                            .where(or_(*wanted)).order_by(request_logprobs.c.request_id,
                                                          request_logprobs.c.start))
        for key, records in rows:
            out.setdefault(key, []).extend(TokenLogprobs.from_json(r) for r in records)
    return {key: tuple(records) for key, records in out.items()}
