"""What the daemon loop pushes over its link (core/daemon/link.py): each step's text of linked requests,
and their ends once written to the table.

A request is linked while a connected server watches its job: its tokens
then reach the table with the batch writes (the writer reads `Held.linked`),
since the server has them already. When the link goes, the next step
unlinks it and the writer flushes it every step again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fsched.core.daemon.engine import EngineResult
from fsched.core.daemon.holdings import Holdings
from fsched.core.types import RequestId

Output = Callable[[RequestId], tuple[list[int], str]]
UNSETTLED = "\ufffd"  # what a tokenizer shows for bytes of a character not complete yet


class Link(Protocol):
    def watcher(self, job_id: int) -> object | None: ...
    def send(self, lines: dict[object, list[dict]]) -> None: ...


class Publisher:
    def __init__(self, link: Link, holdings: Holdings, output: Output, model: str):
        self.link = link
        self.holdings = holdings
        self.output = output
        self.model = model
        self._settled: dict[RequestId, int] = {}  # characters pushed that will not change
        self._ending: list[tuple[object, dict]] = []

    def step(self, produced: dict[RequestId, int], finished: list[EngineResult]) -> None:
        """Push the step's text of linked requests; note the ends to push once they are written."""
        lines: dict[object, list[dict]] = {}
        done = {r.id: r for r in finished}
        for request_id in produced:
            held = self.holdings.get(request_id)
            if held is None:
                continue
            conn = self.link.watcher(held.claimed.job_id)
            held.linked = conn is not None
            if conn is None:
                continue
            if (result := done.get(request_id)) is not None:
                self._ending.append((conn, self._end(held, result)))
                continue
            tokens, text = self.output(request_id)
            start = self._settled.get(request_id, 0)
            self._settled[request_id] = len(text.rstrip(UNSETTLED))
            lines.setdefault(conn, []).append({
                "job": held.claimed.job_id, "req": str(request_id), "o": start, "t": text[start:],
                "n": len(tokens), "ft": held.first_token_at, "q": held.claimed.enqueued_at})
        self.link.send(lines)

    def written(self, now: float) -> None:
        """The step's completions are in the table: push the linked ones' ends."""
        lines: dict[object, list[dict]] = {}
        for conn, message in self._ending:
            message["end"]["fin"] = now
            lines.setdefault(conn, []).append(message)
        self._ending = []
        self.link.send(lines)

    def _end(self, held, result: EngineResult) -> dict:
        self._settled.pop(result.id, None)
        state = "done" if result.finish_reason is not None else "failed"
        return {"job": held.claimed.job_id, "req": str(result.id), "end": {
            "state": state, "t": result.text if state == "done" else "", "n": len(result.tokens),
            "pt": result.prompt_tokens, "fr": result.finish_reason.value if result.finish_reason else None,
            "err": result.error if state == "failed" else None, "model": self.model,
            "ft": held.first_token_at, "q": held.claimed.enqueued_at}}

    def forget(self, request_id: RequestId) -> None:
        self._settled.pop(request_id, None)
