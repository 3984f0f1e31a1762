"""What the daemon loop pushes over its link (core/daemon/link.py): each step's text of linked requests
(one `Steps` a server a step), and their ends, as the link's messages (`core/ports/link.py`).

A request is linked while a connected server watches its job: its tokens
then reach the table with the batch writes (the writer reads the record's `linked`),
since the server has them already. When the link goes, the next step
unlinks it and the writer flushes it every step again. A pushed request
whose tokens could come out otherwise after a crash (`redraws`: a sampled
one on a remote engine) is written first, in one write for all of them a
step, so a client never sees tokens the table does not hold; its end is pushed once its completion
is written. Any other request's end goes with the step's texts, before its completion's write: a
crash before that write loses nothing the table cannot give back (its successor resumes from the
written tokens and draws the same ones), and the client's next request, sent when it sees the end,
is not held back by the write (a transaction, 4-10 ms p50 on PostgreSQL under load).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fsched.core.daemon.engine import EngineResult
from fsched.core.daemon.holdings import Holdings
from fsched.core.ports.link import End, Message, Steps, StepText
from fsched.core.ports.records import StorageError
from fsched.core.sched.request import Request
from fsched.core.stamps import stamp
from fsched.core.types import RequestId

Text = Callable[[Request], str]  # a live request's output text so far
Write = Callable[[list[Request]], None]  # write these requests' tokens now (raises if the table fails)
UNSETTLED = "\ufffd"  # what a tokenizer shows for bytes of a character not complete yet


class Link(Protocol):
    def watcher(self, job_id: int) -> object | None: ...
    def send(self, lines: dict[object, list[Message]]) -> None: ...


class Publisher:
    def __init__(self, link: Link, holdings: Holdings, text: Text, model: str,
                 redraws: Callable[[Request], bool] = lambda request: False,
                 write_first: Write | None = None):
        self.link = link
        self.holdings = holdings
        self.text = text
        self.model = model
        self.redraws = redraws
        self.write_first = write_first
        self._settled: dict[RequestId, int] = {}  # characters pushed that will not change
        self._redraws: dict[RequestId, bool] = {}  # whether a pushed request redraws (asked once)
        self._timed: dict[RequestId, object] = {}  # the connection told a pushed request's times
        self._ending: list[tuple[object, End]] = []

    def step(self, produced: dict[RequestId, int], finished: list[EngineResult], now: float) -> None:
        """Push the step's text of linked requests, and the ends of those that do not redraw (`now` their
        time); note the others' ends, to push once they are written."""
        texts: dict[object, list[StepText]] = {}
        done = {r.id: r for r in finished}
        pushed: list[tuple[object, Request]] = []
        ends: dict[object, list[Message]] = {}
        first: list[Request] = []  # pushed ones to write first
        get, watcher = self.holdings.get, self.link.watcher
        for request_id in produced:
            held = get(request_id)
            if held is None:
                continue
            conn = watcher(held.job_id)
            held.linked = conn is not None
            if conn is None:
                continue
            if done and (result := done.get(request_id)) is not None:
                stamp("finished", held.job_id)
                if self._redraws_of(held):
                    self._ending.append((conn, self._end(held, result)))  # pushed once written
                else:
                    ends.setdefault(conn, []).append(self._end(held, result, finished_at=now))
                    stamp("end_pushed", held.job_id)
                continue
            pushed.append((conn, held))
            if self._redraws_of(held):
                first.append(held)
        if first and self.write_first is not None:
            try:
                self.write_first(first)
            except StorageError:  # not shown, then: their text goes with a later step's, once written
                unwritten = {held.id for held in first}
                pushed = [(conn, held) for conn, held in pushed if held.id not in unwritten]
        settled, timed, text_of, offset = self._settled, self._timed, self.text, self.holdings.wall_offset
        for conn, held in pushed:
            request_id = held.id
            text = text_of(held)
            start = settled.get(request_id, 0)
            settled[request_id] = len(text.rstrip(UNSETTLED))
            times = None
            if timed.get(request_id) is not conn:  # its times go with its first texts on a connection
                at = held.first_token_at  # on the engine's clock: pushed on the daemon's (holdings.py)
                times = (None if at is None else at + offset, held.enqueued_at)
                if at is not None:
                    timed[request_id] = conn
                    stamp("pushed", held.job_id)
            found = texts.get(conn)
            if found is None:
                found = texts[conn] = []
            found.append(StepText(held.job_id, request_id, start, text[start:], len(held.output), times))
        lines: dict[object, list[Message]] = {conn: [Steps(found)] for conn, found in texts.items()}
        for conn, messages in ends.items():
            lines.setdefault(conn, []).extend(messages)
        self.link.send(lines)

    def _redraws_of(self, held: Request) -> bool:
        """`redraws(held)`, asked once a request (its parameters do not change)."""
        found = self._redraws.get(held.id)
        if found is None:
            found = self._redraws[held.id] = self.redraws(held)
        return found

    def written(self, now: float) -> None:
        """The step's completions are in the table: push the ends that waited for it."""
        lines: dict[object, list[Message]] = {}
        for conn, end in self._ending:
            end.finished_at = now  # this publisher's own message, not sent before
            lines.setdefault(conn, []).append(end)
            stamp("end_pushed", end.job)
        self._ending = []
        self.link.send(lines)
        if len(self._settled) > 2 * len(self.holdings) + 64:  # requests that ended unlinked, or dropped
            for request_id in [rid for rid in self._settled if rid not in self.holdings]:
                self.forget(request_id)

    def _end(self, held, result: EngineResult, finished_at: float | None = None) -> End:
        self.forget(result.id)
        done = result.status.succeeded
        return End(held.job_id, str(result.id), result.status,
                   text=result.text if done else "", tokens=len(result.tokens),
                   prompt_tokens=result.prompt_tokens,
                   error=None if done else result.error, model=self.model,
                   first_token_at=self.holdings.first_token_at(held), enqueued_at=held.enqueued_at,
                   finished_at=finished_at)

    def forget(self, request_id: RequestId) -> None:
        self._settled.pop(request_id, None)
        self._redraws.pop(request_id, None)
        self._timed.pop(request_id, None)
