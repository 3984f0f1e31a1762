"""Writing a daemon's output back to the queue: tokens as they come, completions whole.

After each engine step one transaction (`write_step`) carries the step's
completions, the latency classes' tokens and the claim of work announced
meanwhile: a transaction's own cost paid once a step, not once for each.
The less urgent tokens follow a share at a time (`after_step`).

Every write names the lease epoch it was made under, so the queue refuses it
once the daemon has lost the request; refusals are counted (`fenced`). A
write the queue could not take (StorageError) is kept and tried again:
completions stay in `unwritten`, tokens stay dirty.
"""

from __future__ import annotations

from collections.abc import Callable

from fsched.core.daemon import flushplan
from fsched.core.daemon.engine import EngineResult
from fsched.core.daemon.holdings import Holdings
from fsched.core.faults import crash_point
from fsched.core.ports.queue import ClaimAsk, QueueStore
from fsched.core.ports.records import Completion, TokenUpdate
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId, RequestStatus

Text = Callable[[Request], str]  # a live request's output text so far (its tokens are on the record)
Asked = Callable[[], bool]  # whether new work was announced and waits for the daemon's loop

# While the daemon holds realtime or streaming work and new work may be announced, a batch flush goes
# in transactions of at most this many rows (at a few thousand tokens a row, a few milliseconds on
# SQLite each), and an announcement between two of them leaves the rest to the next flush: its claim
# and the step that starts it go first. One transaction of a flush's whole share (52 rows at 256
# slots) took 40-90 ms on SQLite, and every realtime request arriving meanwhile waited for it.
ROWS_PER_WRITE = 16


class Writer:
    def __init__(self, store: QueueStore, owner: str, model: str, holdings: Holdings, text: Text,
                 batch_flush_s: float):
        self.store = store
        self.owner = owner
        self.model = model
        self.holdings = holdings
        self.text = text
        self.bounds = flushplan.FlushBounds(every_s=batch_flush_s)
        self.unwritten: list[Completion] = []  # finished in the engine, not yet in the table
        self.fenced = 0  # writes the queue refused: leases this daemon had lost
        self._last_batch_flush = float("-inf")
        self._waiting_since: dict[RequestId, float] = {}  # less urgent dirty requests: since when

    def write_step(self, claim: ClaimAsk | None = None) -> list[Request]:
        """One transaction: the pending completions, the latency classes' dirty tokens and, given, a
        claim; the requests it claimed. A failure (StorageError) writes and claims nothing: the
        completions stay pending, the tokens dirty."""
        urgent = [held for held in self.holdings.requests() if held.dirty and held.latency_sensitive]
        return self._write(urgent, claim)

    def after_step(self, now: float, batch: bool = True, asked: Asked | None = None) -> None:
        """Latency classes' tokens every step; the others a share at a time (core/daemon/flushplan),
        unless `batch` is False (they wait for a later step); `asked` as in `flush`."""
        self.flush(everything=False, now=now, batch=batch, asked=asked)

    def flush(self, everything: bool, now: float, batch: bool = True, asked: Asked | None = None) -> None:
        """Persist dirty tokens: latency-sensitive requests' always, the others' when the flush plan
        says so (and `batch`), or all of them when `everything`. `asked`: while latency work is held,
        the batch rows go `ROWS_PER_WRITE` a transaction, and stop when it says new work waits (the
        overdue ones and the first transaction always go: the flush plan's bound holds)."""
        urgent = []
        latency_held = False
        waiting = self._waiting_since  # kept from step to step: a request joins when it turns dirty
        for held in self.holdings.requests():
            latency_held = latency_held or held.request_class is not RequestClass.BATCH
            if held.dirty:
                if held.latency_sensitive:
                    urgent.append(held)
                elif held.id not in waiting:
                    waiting[held.id] = now
        if everything:
            chosen = list(waiting)
        else:
            chosen = flushplan.due(waiting.items(), self._last_batch_flush, now, self.bounds) if batch else []
        if chosen:
            self._last_batch_flush = now
        rows, overdue = [], 0
        for rid in chosen:
            held = self.holdings.get(rid)
            if held is None or not held.dirty:
                del waiting[rid]  # ended (or written with the urgent ones) since it began to wait
            else:
                rows.append(held)
                overdue += now - waiting[rid] >= self.bounds.overdue_s
        if everything or asked is None or not latency_held:
            self._write(urgent + rows)
            return
        first = max(overdue, ROWS_PER_WRITE)
        self._write(urgent + rows[:first])
        for start in range(first, len(rows), ROWS_PER_WRITE):
            if asked():
                return  # the rest, now the longest waiting, go first at the next flush
            self._write(rows[start:start + ROWS_PER_WRITE])

    def next_flush_at(self) -> float | None:
        """When the next batch flush writes something (None while no tokens wait for one): a timed
        duty of the loop (core/daemon/duties.py)."""
        return flushplan.next_due(self._waiting_since.values(), self._last_batch_flush, self.bounds)

    def write_now(self, requests: list[Request]) -> None:
        """Write these requests' tokens now (those not written yet), in one transaction: before they
        are shown to anyone. Raises StorageError as a flush does (they stay dirty)."""
        self._write([held for held in requests if held.dirty])

    def _write(self, dirty: list[Request], claim: ClaimAsk | None = None) -> list[Request]:
        """One transaction of these requests' tokens, the pending completions and the claim; only once
        it is in are the tokens clean and the completions written (a failed write raises and leaves
        them dirty and pending, to be retried, and claims nothing)."""
        if not (dirty or self.unwritten or claim):
            return []
        done = self.unwritten
        result = self.store.write_step(self.owner, [self._update(held) for held in dirty], done, claim)
        self.unwritten = []
        for held in dirty:
            held.dirty = False
            self._waiting_since.pop(held.id, None)
        # A refused write: the request already ended, or this daemon lost its lease.
        self.fenced += len(dirty) - result.written + result.finished.count(False)
        if result.written:
            crash_point("after_flush")
        return result.claimed

    def finished(self, results: list[EngineResult]) -> None:
        """The step's finished requests, output and final state, to write with the step (`write_step`)."""
        for result in results:
            held = self.holdings.pop(result.id)
            self._waiting_since.pop(result.id, None)
            if held is not None:
                self.unwritten.append(self._completion(result, held))

    def write_completions(self) -> None:
        """Write pending completions in one transaction (kept for a retry if it fails)."""
        self._write([])

    def cancelled(self, held: Request, text: str) -> None:
        """End a request whose job was cancelled, keeping its output so far (`text` its text)."""
        self._waiting_since.pop(held.id, None)
        self._one(Completion(held.id, RequestStatus.FINISHED_CANCELLED, tuple(held.output), text,
                             first_token_at=self.holdings.first_token_at(held), lease_epoch=held.lease_epoch,
                             logprobs=tuple(held.output_logprobs)))

    def failed(self, request_id: RequestId, error: str, tokens: list[int], lease_epoch: int) -> None:
        self._one(Completion(request_id, RequestStatus.FINISHED_FAILED, tuple(tokens), "", error=error,
                             model=self.model, lease_epoch=lease_epoch))

    def pending_leases(self) -> dict[RequestId, int]:
        """The leases of completions not written yet: they must be renewed like held requests."""
        return {c.request_id: c.lease_epoch for c in self.unwritten if c.lease_epoch is not None}

    def _one(self, completion: Completion) -> None:
        (written,) = self.store.finish_requests([completion], self.owner)
        self.fenced += not written

    def _update(self, held: Request) -> TokenUpdate:
        return TokenUpdate(held.id, tuple(held.output), self.text(held), self.holdings.first_token_at(held),
                           held.lease_epoch, tuple(held.output_logprobs))

    def _completion(self, result: EngineResult, held: Request) -> Completion:
        if not result.status.succeeded:
            return Completion(result.id, result.status, tuple(result.tokens),
                              error=result.error or "failed", model=self.model, lease_epoch=held.lease_epoch)
        return Completion(
            result.id, result.status, tuple(result.tokens), result.text, prompt_tokens=result.prompt_tokens,
            model=self.model, first_token_at=self.holdings.first_token_at(held), lease_epoch=held.lease_epoch,
            logprobs=tuple(result.logprobs),
        )
