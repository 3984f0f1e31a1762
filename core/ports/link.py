"""The daemon link's messages, both ways: one definition for the daemon's end and the server's.

A link (`core/daemon/link.py`, the daemon's end; `api/link.py`, an HTTP
server's) carries these messages and nothing else. Each is a small dataclass
(not frozen: a frozen one costs four times as much to make, and a `StepText`
is made for every watched request at every step); `encode` makes the bytes
of a list of them, `decode` reads one back from a line. How they are written
is this module's alone (today one JSON array a line: the message's tag, then
its fields in their order; ASCII, so any text, NUL and lone surrogates
included, crosses as escapes), so a change of the encoding (one binary frame
a step, say) is made here, for both ends at once.

A server speaks first: `Hello(VERSION)`, then what it wants. The daemon
answers with its own `Hello`. Either end that reads another version (or a
first line that is no hello, as from a fsched that predates versions)
refuses the link: it logs both versions at error level and closes the
connection. The server then serves from the table, as without a link:
losing the link loses speed, never an answer. Bump `VERSION` with any change
of a message's fields or of the encoding.

Server to daemon: `Wake` (sync with the table now: a cancel, a new link),
`Claim` (new online work: claim now), `Watch(job)` / `Forget(job)` (push, or
stop pushing, the progress of that job's requests; a watch is new work and
claims too), `Follow(job)` (a watch that claims nothing: a claim was asked
for since the job was stored, on the server's second connection, its
nudge, which its group commit's thread writes the moment the job's
transaction ends). Daemon to server: `Steps` after each step that gave watched
requests tokens (one message, one line, for all of that server's: each
request's `StepText`, its text from character `start` on, a tail the
tokenizer has not settled being sent again; its times only with its first
texts on a connection), `End` once a completion is in
the table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

from fsched.core.ports.records import RequestProgress
from fsched.core.types import RequestId, RequestStatus

VERSION = 5


class LinkRefused(ValueError):
    """A line this end cannot take: another version's, no hello first, or not a message at all."""


@dataclass(slots=True)
class Hello:
    version: int
    TAG: ClassVar[str] = "hello"


@dataclass(slots=True)
class Wake:
    TAG: ClassVar[str] = "wake"


@dataclass(slots=True)
class Claim:
    TAG: ClassVar[str] = "claim"


@dataclass(slots=True)
class Watch:
    job: int
    TAG: ClassVar[str] = "watch"

    def __post_init__(self) -> None:
        _check_job(self.job)


@dataclass(slots=True)
class Follow:
    job: int
    TAG: ClassVar[str] = "follow"

    def __post_init__(self) -> None:
        _check_job(self.job)


@dataclass(slots=True)
class Forget:
    job: int
    TAG: ClassVar[str] = "forget"

    def __post_init__(self) -> None:
        _check_job(self.job)


def _check_job(job: object) -> None:
    if isinstance(job, bool) or not isinstance(job, int):
        raise TypeError(f"a job id is an integer, not {job!r}")


@dataclass(slots=True)
class StepText:
    """A step's text of one request: the whole text is what the server had up to `start`, then `text`.
    Not a message of its own: it travels in a `Steps`."""

    job: int
    request: RequestId
    start: int
    text: str
    tokens: int  # output tokens so far
    # (first_token_at, enqueued_at): with a request's first texts on a connection, until its first token's
    # time is known; None after (two floats a token were most of what a line cost to write and read).
    times: tuple[float | None, float] | None = None
    TAG: ClassVar[str] = "text"

    def progress(self, before: str) -> RequestProgress:
        """The request's progress, `before` being the text the server had of it."""
        return self.running(before[: self.start] + self.text)

    def running(self, text: str) -> RequestProgress:
        """The request's progress, `text` being its whole text (what the server had to `start`, then
        this step's); its times are those of an earlier text of it when this one carries none (unknown
        times, which only a protocol fault leaves: none, and enqueued at 0)."""
        first_token_at, enqueued_at = self.times or (None, 0.0)
        return RequestProgress(self.request, self.job, RequestStatus.RUNNING, text, self.tokens,
                               enqueued_at, first_token_at, finished_at=None, error=None)


@dataclass(slots=True)
class Steps:
    """A step's texts of the requests one server watches, in one line (one read, one parse, however
    many requests)."""

    texts: list[StepText]
    TAG: ClassVar[str] = "steps"


@dataclass(slots=True)
class End:
    """A request's end: pushed once its completion is in the table where its tokens could come out
    otherwise after a crash (core/daemon/publish.py), with its step's texts for the others."""

    job: int
    request: RequestId
    status: RequestStatus  # a finished one (its word on the wire)
    text: str
    tokens: int
    prompt_tokens: int | None
    error: str | None
    model: str | None
    first_token_at: float | None
    enqueued_at: float
    finished_at: float | None = None  # set when it is pushed: its step's end, or its completion's write
    TAG: ClassVar[str] = "end"

    def progress(self) -> RequestProgress:
        return RequestProgress(self.request, self.job, self.status, self.text, self.tokens, self.enqueued_at,
                               self.first_token_at, self.finished_at, self.error,
                               prompt_tokens=self.prompt_tokens, model=self.model)


Message = Hello | Wake | Claim | Watch | Follow | Forget | Steps | End
_TYPES: dict[str, type] = {t.TAG: t for t in (Hello, Wake, Claim, Watch, Follow, Forget, Steps, End)}
# ASCII: every character escaped as JSON says. A message holds no container twice: the check for
# circular references (a dict entry for every list and tuple written) is left out.
_dumps = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _fields_of(kind: type) -> Callable[[Message], tuple]:
    """A message's fields in their order, as a tuple (attrgetter: one C call on the per-token path)."""
    names = kind.__slots__
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda message: (one(message),)
    return lambda message: ()


_FIELDS = {kind: _fields_of(kind) for kind in _TYPES.values()}


def _end_fields(end: End) -> tuple:
    """An end's fields, its status by its word (readable on the wire, and not its number)."""
    fields = _END_FIELDS(end)
    return (*fields[:2], fields[2].word, *fields[3:])


_END_FIELDS = _FIELDS[End]
_FIELDS[End] = _end_fields
_TEXT_FIELDS = _fields_of(StepText)
_FIELDS[Steps] = lambda steps: (list(map(_TEXT_FIELDS, steps.texts)),)


def encode(messages: Iterable[Message]) -> bytes:
    """The bytes of `messages`, one line each."""
    return "".join([_dumps([m.TAG, *_FIELDS[type(m)](m)]) + "\n" for m in messages]).encode()


def decode(line: bytes | str) -> Message:
    """One message from its line, or LinkRefused when it is not one of this version's."""
    try:
        tag, *fields = json.loads(line)
        kind = _TYPES[tag]
        if kind is Steps:
            (texts,) = fields
            return Steps([_text(*f) for f in texts])
        if kind is End:
            fields[2] = RequestStatus.of_word(fields[2])  # the status, by its word
        return kind(*fields)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise LinkRefused(f"not a message of link version {VERSION}: {line[:80]!r}") from exc


def _text(job: int, request: str, start: int, text: str, tokens: int, times: list | None = None) -> StepText:
    if not (type(job) is int and type(request) is str and type(start) is int and type(text) is str):
        raise TypeError("a step's text is a job, a request id, a start and text")
    if times is None:
        return StepText(job, request, start, text, tokens)
    first_token_at, enqueued_at = times
    return StepText(job, request, start, text, tokens, (first_token_at, enqueued_at))


def greeting(line: bytes | str, peer: str) -> Hello:
    """The hello a link must open with, or LinkRefused saying why (both versions, for the log)."""
    try:
        message = decode(line)
    except LinkRefused:
        message = None
    if not isinstance(message, Hello):
        raise LinkRefused(f"{peer} did not open with a hello: it speaks no link version, this end "
                          f"speaks {VERSION}; the link is refused")
    if message.version != VERSION:
        raise LinkRefused(f"{peer} speaks link version {message.version}, this end {VERSION}; "
                          "the link is refused")
    return message
