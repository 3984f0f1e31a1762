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

import math
import os
from collections.abc import Callable

from fsched.core.daemon import flushplan
from fsched.core.daemon.engine import EngineResult
from fsched.core.daemon.holdings import Holdings
from fsched.core.faults import crash_point
from fsched.core.ports.queue import ClaimAsk, QueueStore
from fsched.core.ports.records import Completion, TokenUpdate
from fsched.core.sched.request import Request
from fsched.core.types import RequestId, RequestStatus

Text = Callable[[Request], str]  # a live request's output text so far (its tokens are on the record)

# A due share of batch rows goes out over the daemon's next turns, in transactions of at least this
# many rows (at a few thousand tokens a row, a few milliseconds on SQLite each), the engine's wait for
# tokens between two of them. One transaction of a whole share (52 rows at 256 slots) took 40-90 ms on
# SQLite, and the same share in back-to-back transactions of 16 left SQLite's write lock free for
# microseconds at a time: a server's group commit, retrying every millisecond, waited for all of it
# (34-40 ms at p90 under a full batch, measured), and so did every realtime request it held.
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
        # Requests filed as they turn dirty (Holdings.take_fresh), so that a step's writes visit those,
        # not every held request: the latency classes' (written every step) and the others not yet
        # in `_waiting_since` (they join it at the next flush, at its time).
        self._urgent: dict[RequestId, Request] = {}
        self._unfiled: list[Request] = []
        self._spread: list[RequestId] = []  # the due share's rows not written yet, oldest first
        self._last_turn_at: float | None = None

    def write_step(self, claim: ClaimAsk | None = None) -> list[Request]:
        """One transaction: the pending completions, the latency classes' dirty tokens and, given, a
        claim; the requests it claimed. A failure (StorageError) writes and claims nothing: the
        completions stay pending, the tokens dirty."""
        return self._write(self._urgent_rows(), claim)

    def _urgent_rows(self) -> list[Request]:
        """The latency classes' requests whose tokens wait (`latency_sensitive` read as the step left it:
        the publisher sets `linked` for the requests that produced, and a request that produced is filed
        again here)."""
        urgent, unfiled = self._urgent, self._unfiled
        for held in self.holdings.take_fresh():
            if held.latency_sensitive:
                urgent[held.id] = held
            else:
                unfiled.append(held)
        get = self.holdings.get
        rows = [held for rid, held in urgent.items()
                if held.dirty and held.latency_sensitive and get(rid) is held]
        if len(rows) != len(urgent):  # written (or no more urgent, or ended) since: filed no longer
            self._urgent = {held.id: held for held in rows}
        return rows

    def after_step(self, now: float, batch: bool = True) -> None:
        """Latency classes' tokens every step; the others a share at a time (core/daemon/flushplan),
        spread over the turns, unless `batch` is False (they wait for a later step)."""
        self.flush(everything=False, now=now, batch=batch)

    def flush(self, everything: bool, now: float, batch: bool = True) -> None:
        """Persist dirty tokens: latency-sensitive requests' always, the others' when the flush plan
        says so (and `batch`), or all of them when `everything`.

        A due share is written over the turns until the next share is due, a part a turn
        (`_part`): each transaction short, SQLite's write lock free between them while the engine
        is awaited. The overdue rows always go at once: the flush plan's bound holds."""
        # The turns' pace, from the last one: after a quiet spell (or none yet), a quarter of the gap
        # between shares (the deadline, not this guess, makes the last part take all that is left).
        longest = self.bounds.gap_s / 4
        turn_s = longest if self._last_turn_at is None else min(now - self._last_turn_at, longest)
        self._last_turn_at = now
        urgent = self._urgent_rows()
        waiting = self._waiting_since  # kept from step to step: a request joins when it turns dirty
        for held in self._unfiled:
            if held.dirty and held.id not in waiting:
                waiting[held.id] = now
        self._unfiled = []
        if everything:
            self._spread = []
            self._write(urgent + self._still_dirty(list(waiting)))
            return
        if not batch:
            self._write(urgent)
            return
        due = flushplan.due(waiting.items(), self._last_batch_flush, now, self.bounds)
        if due:
            self._last_batch_flush = now
            spread = set(self._spread)
            self._spread += [rid for rid in due if rid not in spread]
        # A row of the share may have been written meanwhile (`write_now`) or have ended: only those still
        # dirty stay, each waiting since it turned dirty again.
        rows = self._still_dirty(self._spread)
        if due:
            rows.sort(key=lambda held: waiting.get(held.id, now))  # oldest first: the overdue ones lead
        overdue = sum(now - waiting.get(held.id, now) >= self.bounds.overdue_s for held in rows)
        take = max(overdue, self._part(len(rows), now, turn_s))
        self._spread = [held.id for held in rows[take:]]
        self._write(urgent + rows[:take])

    def _still_dirty(self, ids: list[RequestId]) -> list[Request]:
        """The held requests of `ids` whose tokens still wait, in order (the others leave the waiting:
        ended, or written with the urgent ones, since they began to wait)."""
        rows = []
        for rid in ids:
            held = self.holdings.get(rid)
            if held is None or not held.dirty:
                self._waiting_since.pop(rid, None)
            else:
                rows.append(held)
        return rows

    def _part(self, left: int, now: float, turn_s: float) -> int:
        """How many of the share's `left` rows this turn writes: enough that the rest is written by
        the time the next share is due (at the turns' pace), at least ROWS_PER_WRITE."""
        if not left:
            return 0
        remaining_s = self._last_batch_flush + self.bounds.gap_s - now
        if turn_s <= 0 or remaining_s <= turn_s:
            return left
        turns = remaining_s / turn_s
        return min(left, max(ROWS_PER_WRITE, math.ceil(left / turns)))

    def next_flush_at(self) -> float | None:
        """When the next batch flush writes something (None while no tokens wait for one): a timed
        duty of the loop (core/daemon/duties.py); while a share is being written, the next turn."""
        if self._spread:
            return self._last_turn_at
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
        updates = [self._update(held) for held in dirty]
        result = self.store.write_step(self.owner, updates, done, claim)
        self.unwritten = []
        for held, update in zip(dirty, updates, strict=True):
            held.dirty = False
            held.written_text = update.text
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
        text = self.text(held)
        return TokenUpdate(held.id, tuple(held.output), text, self.holdings.first_token_at(held),
                           held.lease_epoch, tuple(held.output_logprobs), kept_of(held.written_text, text))

    def _completion(self, result: EngineResult, held: Request) -> Completion:
        if not result.status.succeeded:
            return Completion(result.id, result.status, tuple(result.tokens),
                              error=result.error or "failed", model=self.model, lease_epoch=held.lease_epoch)
        return Completion(
            result.id, result.status, tuple(result.tokens), result.text, prompt_tokens=result.prompt_tokens,
            model=self.model, first_token_at=self.holdings.first_token_at(held), lease_epoch=held.lease_epoch,
            logprobs=tuple(result.logprobs),
        )


def kept_of(written: str | None, text: str) -> int | None:
    """How many leading characters of `text` equal the text last written (`written`; None: none this
    daemon wrote, so the table's is not known): most writes only add to the text, but a character held
    back whole can change the last one written."""
    if written is None:
        return None
    if text.startswith(written):
        return len(written)
    return len(os.path.commonprefix((written, text)))
