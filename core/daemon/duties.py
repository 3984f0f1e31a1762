"""How long a daemon's engine step may wait for a remote engine's tokens: around its next timed duty.

A step over a remote engine waits until a token arrives, until new work is
announced (the link's wake descriptor ends the wait at once; a cancel asks
for a sync the same way) or until a bound passes. A wait that the bound
ends carries nothing, and the turn around it (the scheduler's plan and
postprocess, the writer, the heartbeat check) costs about as much as one
with tokens. A fixed bound of 50 ms, shorter than the engine's iterations
behind vLLM on a loaded machine (22-61 ms p50, up to 200 ms p90), ended
many waits empty; what it bounded, though, was how late the loop's timed
duties could be done, since the loop does them between steps:

- the sync (weights, cancels and new work from the table): `sync_interval_s`
  after the last;
- the heartbeat, which renews the leases: `heartbeat_s` after the last;
- on a shared queue, the sweep: `sweep_s` after the last;
- the writer's next batch flush (batch work's and linked requests' tokens),
  when tokens wait for one (core/daemon/flushplan.py `next_due`).

So the bound is that lateness itself: the wait lasts until the first duty
has been due `late_s`, at most `cap_s`. A duty is done at the first turn
after it falls due, which is a turn with tokens whenever the engine sends
within `late_s`, and `late_s` after it at the latest, as before; the wait
does not end empty every `late_s` when nothing is due. (Ending it at the
due time itself gave more empty turns than the fixed bound: a sync ten
times a second and a batch flush five times fell inside waits that tokens
would have ended a few milliseconds later.) While housekeeping is put off
for fresh latency work (core/daemon/putoff.py), the duties' times do not
count (the turn that ends the put-off does them): the bound is `late_s`,
as before. The engine bounds a wait by `late_s` too while requests wait in
the scheduler after its plan (core/daemon/engine.py `step`): the
scheduler's plan depends on the clock then (aging reorders the waiters; a
tenant's precedence, recovered as its use decays, lets a waiter preempt a
running request), and the step after the wait decides again, as often as
before.

Pure: the caller passes the loop's state and the clock's reading.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Duties:
    """When each of the daemon's timed duties falls due, on the daemon's clock (None: none pending),
    and what shortens a wait besides them."""

    sync_at: float
    beat_at: float
    sweep_at: float | None = None  # a shared queue's sweep (None on a queue of its own)
    flush_at: float | None = None  # the writer's next batch flush (None: no tokens wait for one)
    put_off: bool = False  # housekeeping is put off for fresh latency work

    @property
    def next_at(self) -> float:
        """When the first of the duties falls due."""
        due = min(self.sync_at, self.beat_at)
        for at in (self.sweep_at, self.flush_at):
            if at is not None and at < due:
                due = at
        return due


def wait_bound(duties: Duties, now: float, cap_s: float, late_s: float) -> float:
    """Seconds the engine step starting at `now` may wait for tokens: until the first duty has been due
    `late_s` (see the module's text), at most `cap_s`."""
    if duties.put_off:
        return min(cap_s, late_s)
    return min(cap_s, max(0.0, duties.next_at + late_s - now))
