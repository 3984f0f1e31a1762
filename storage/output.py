"""A running request's output as the table keeps it: appended in pieces (`request_output`), not rewritten.

A running realtime or streaming request's output is written at every step.
Written as one value that every write replaced, a step's write cost in
proportion to the whole output so far: a request's writes grew with the
square of its length, and a long answer (thousands of tokens) made every
step of the daemon slow for every tenant. Here a write appends what the
table does not hold yet as one piece: the token ids after those stored
(`requests.num_output_tokens` says how many are), and the text after the
characters the writer says the table holds already (`TokenUpdate.text_kept`:
a character held back whole can change the last one written, so a piece
says how much of the text before it stays). A request's output is its row's
`output_tokens` and `output_text` with its pieces applied in order; the write
that ends a request puts it all in its row and drops its pieces, so an ended
request is read from its row alone. A writer that does not know what the
table holds (its first write after a claim) writes the output whole, as a
request's last write does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, and_, bindparam, column, delete, or_, select
from sqlalchemy.sql.elements import ColumnElement

from fsched.storage.direct import Tx
from fsched.storage.models import RequestOutput
from fsched.storage.prepared import Batched, Prepared, listed, recordset

request_output = RequestOutput.__table__
READ_KEYS = 400  # request keys a statement names at once (SQLite binds at most 999 parameters a statement)
_COLUMNS = (request_output.c.request_id, request_output.c.start, request_output.c.tokens,
            request_output.c.text_kept, request_output.c.text)


def new_piece(key: int, stored: int, tokens: Sequence[int], text: str, text_kept: int) -> dict:
    """The piece that appends `tokens[stored:]` (at least one) to request `key`'s tokens, and
    `text[text_kept:]` to the first `text_kept` characters of its text."""
    return {"request_id": key, "start": stored, "tokens": list(tokens[stored:]), "text_kept": text_kept,
            "text": text[text_kept:]}


_PIECES = recordset(*(column(c.name, c.type) for c in _COLUMNS))
APPEND = Batched(
    request_output.insert().values(**{c.name: bindparam(c.name) for c in _COLUMNS}),
    request_output.insert().from_select([c.name for c in _COLUMNS],
                                        select(*(_PIECES.c[c.name] for c in _COLUMNS))),
)
PIECES_OF = Prepared(lambda n: select(*_COLUMNS)
                     .where(listed(request_output.c.request_id, "b_keys", n))
                     .order_by(request_output.c.request_id, request_output.c.start), listed="b_keys")
DROP_PIECES = Prepared(lambda n: delete(request_output)
                       .where(listed(request_output.c.request_id, "b_keys", n)), listed="b_keys")


def has_pieces(key: ColumnElement) -> ColumnElement:
    """Whether the request `key` names has pieces (a column of a read of its row: its pieces are dropped
    only where there are some, a statement fewer for most writes that end a request)."""
    return select(request_output.c.request_id).where(request_output.c.request_id == key).exists() \
        .label("has_pieces")


def append(tx: Tx, pieces: Iterable[dict | None]) -> None:
    """Store the pieces (one statement on PostgreSQL, one executemany elsewhere)."""
    tx.many(APPEND, [p for p in pieces if p is not None])


def drop(tx: Tx, keys: Sequence[int]) -> None:
    """Drop these requests' pieces (their rows now hold all their output); none: nothing is sent."""
    for at in range(0, len(keys), READ_KEYS):
        tx.run(DROP_PIECES, {"b_keys": list(keys[at : at + READ_KEYS])})


@dataclass(slots=True)
class Output:
    """A request's output read so far: its row's and its pieces' (`end`: the token where the next piece
    starts, the one a reader that holds these reads from)."""

    tokens: list[int]
    text: str
    end: int = 0
    broken: bool = False  # a piece did not follow on: read at two moments (below)

    def apply(self, start: int, tokens: Sequence[int], text_kept: int, text: str) -> None:
        """Apply the next piece. On PostgreSQL a reader's statements each see what was committed when
        they began: a row read before a daemon wrote the output whole, and its pieces after, do not
        follow on, and such an output is not used (its row is read again at the next poll)."""
        if start != self.end or text_kept > len(self.text):
            self.broken = True
            return
        self.tokens.extend(tokens)
        self.text = self.text[:text_kept] + text if text_kept < len(self.text) else self.text + text
        self.end = start + len(tokens)


def in_pieces(rows: Iterable) -> list[int]:
    """The keys of the rows (with `id`, `output_tokens` and `num_output_tokens`) whose row holds only
    part of their output: the rest is in pieces."""
    return [row.id for row in rows if row.num_output_tokens > len(row.output_tokens or ())]


def _from_row(row) -> Output:
    tokens = list(row.output_tokens or ())
    return Output(tokens, row.output_text or "", len(tokens))


def read_whole(tx: Tx, rows: Sequence) -> dict[int, Output]:
    """The output of each of `rows` that has pieces, whole (in a daemon's transaction)."""
    by_key = {row.id: row for row in rows}
    out: dict[int, Output] = {}
    keys = in_pieces(rows)
    for at in range(0, len(keys), READ_KEYS):
        for key, start, tokens, kept, text in tx.rows(PIECES_OF, {"b_keys": list(keys[at : at + READ_KEYS])}):
            out.setdefault(key, _from_row(by_key[key])).apply(start, tokens, kept, text)
    return _followed_on(out)


def read(conn: Connection, rows: Sequence, since: Mapping[int, Output] | None = None) -> dict[int, Output]:
    """The output of each of `rows` that has pieces: the row's with its pieces applied; for a key `since`
    names, that output (read before, and changed in place) with the pieces from its `end` on applied. An
    output whose pieces do not follow on is left out."""
    since = since or {}
    by_key = {row.id: row for row in rows}
    out = {key: since[key] for key in by_key if key in since}
    keys = in_pieces(rows)
    for at in range(0, len(keys), READ_KEYS):
        part = keys[at : at + READ_KEYS]
        whole = [k for k in part if k not in since]
        wanted = [request_output.c.request_id.in_(whole)] if whole else []
        wanted += [and_(request_output.c.request_id == k, request_output.c.start >= since[k].end)
                   for k in part if k in since]
        pieces = conn.execute(select(*_COLUMNS).where(or_(*wanted))
                              .order_by(request_output.c.request_id, request_output.c.start))
        for key, start, tokens, kept, text in pieces:
            out.setdefault(key, _from_row(by_key[key])).apply(start, tokens, kept, text)
    return _followed_on(out)


def _followed_on(outputs: dict[int, Output]) -> dict[int, Output]:
    """The outputs whose pieces followed on."""
    return {key: output for key, output in outputs.items() if not output.broken}


def whole_output(row, output: Output | None) -> tuple[tuple[int, ...], str]:
    """A request's token ids and text: `output`'s where given (its row with its pieces applied, as read),
    else its row's."""
    if output is None:
        return tuple(row.output_tokens or ()), row.output_text or ""
    return tuple(output.tokens), output.text
