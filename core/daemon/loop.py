"""The daemon loop: the job table feeds the engine, the engine's tokens go back to it.

No SQL and no torch here: the store is any QueueStore, the engine is passed
in, and `encode` turns a claimed request's stored prompt into token ids. The daemon talks to
the engine only through the engine's own methods, reads one clock (its own,
injected) and keys requests by the core's one id type. The loop never holds
a database transaction across a model step: every store call is its own
short transaction between steps.

Each turn:
1. every `sync_interval_s`, when the table may have changed since the last
   sync (the store's cheap check, made once an interval; any commit counts): apply weight changes,
   stop requests whose job was cancelled, claim new work fairly (up to
   `held_batches` batches held per tenant and class);
2. one engine step (over a remote engine, its wait for tokens lasts until
   the first of these timed duties has been due `late_s`: core/daemon/duties.py);
3. persist: the step's finished requests (output and final state), the
   realtime and streaming requests' tokens and the claim of work announced
   during the step in one transaction; batch tokens about every
   `batch_flush_s`, a share at a time;
4. every `heartbeat_s`: the daemon's row with its engine figures.

A turn that claimed realtime or streaming work puts 3's batch flush and 4
off, and the pass after it its sync: the step that takes that work to the
engine comes first (a batch flush is tens of milliseconds on SQLite at 256
slots). For `sync_interval_s` at most, however often such work arrives.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from fsched.core.daemon.duties import Duties, wait_bound
from fsched.core.daemon.engine import Engine, StepFailed, StepReport
from fsched.core.daemon.holdings import Holdings
from fsched.core.daemon.leases import LeaseKeeper
from fsched.core.daemon.link import LinkServer
from fsched.core.daemon.publish import Publisher
from fsched.core.daemon.putoff import PutOff
from fsched.core.daemon.stepfaults import StepFaults
from fsched.core.daemon.writer import Writer
from fsched.core.faults import crash_point
from fsched.core.ports.queue import ClaimAsk, QueueStore
from fsched.core.ports.records import DaemonStats, DaemonSummary, StorageError
from fsched.core.sched.request import Request
from fsched.core.sched.shares import served_shares
from fsched.core.sched.usage import TenantUsage
from fsched.core.stamps import stamp

log = logging.getLogger("fsched.daemon")


@dataclass(slots=True)
class DaemonConfig:
    owner: str
    host: str
    pid: int
    device: str
    model: str
    policy: str
    sync_interval_s: float = 0.1
    batch_flush_s: float = 1.0
    heartbeat_s: float = 1.0
    idle_sleep_s: float = 0.02
    # How late a step's wait for a remote engine's tokens may make the loop's timed work: a duty (sync,
    # heartbeat, sweep, batch flush) past its due time, and, while requests wait in the scheduler, its
    # next decision for them (aging, a preemption for a waiter) (core/daemon/duties.py).
    late_s: float = 0.05
    # Batches of claimed work held per (tenant, class) group: enough to refill the batch between two
    # claims, no more, since what one daemon holds no other daemon can run.
    held_batches: int = 2
    max_attempts: int = 3
    until_idle: bool = False
    exclusive: bool = True  # the only daemon on this job table (SQLite): it may reclaim everything
    share_half_life_s: float = 10.0  # of the served-share figures shown by status
    # Several daemons on one queue (PostgreSQL): a lease lasts `lease_s`
    # unless renewed (once a quarter of it has passed, checked every heartbeat:
    # core/daemon/leases.py); every `sweep_s` a daemon requeues
    # requests whose lease expired, and shares its tenants' usage.
    lease_s: float = 10.0
    sweep_s: float = 1.0
    storage_patience_s: float = 60.0  # how long the job table may fail before the daemon gives up

    def __post_init__(self) -> None:
        for name in ("sync_interval_s", "batch_flush_s", "heartbeat_s", "share_half_life_s", "lease_s",
                     "sweep_s", "late_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be > 0")
        if self.held_batches < 1 or self.max_attempts < 1:
            raise ValueError("held_batches and max_attempts must be >= 1")
        if self.lease_s <= 2 * self.heartbeat_s:
            raise ValueError("lease_s must be more than two heartbeats, or live daemons lose their leases")


class StepFigures:
    """The engine figures a heartbeat publishes, kept step by step (decayed averages, so they
    follow the load; the served use decays on the share figures' half-life)."""

    __slots__ = ("steps", "tokens", "tok_s", "step_ms", "batch", "served")

    def __init__(self, share_half_life_s: float) -> None:
        self.steps = self.tokens = self.batch = 0
        self.tok_s = self.step_ms = 0.0
        self.served = TenantUsage(share_half_life_s)

    def record(self, report: StepReport, wall_s: float, now: float) -> None:
        self.steps += 1
        self.tokens += report.produced
        alpha = 0.1
        self.step_ms += alpha * (report.elapsed_s * 1000 - self.step_ms)
        rate = report.produced / wall_s if wall_s > 0 else 0.0
        self.tok_s += alpha * (rate - self.tok_s)
        self.batch = report.batch_size
        self.served.charge(report.charges, now)

    def served_shares(self, kv_capacity: int, now: float) -> dict[str, float]:
        """Each tenant's part of the dominant resource recently served (sums to 1), as the scheduler
        and the simulator define it."""
        return served_shares(self.served.totals(now), kv_capacity)


class Daemon:
    def __init__(
        self,
        store: QueueStore,
        engine: Engine,
        encode: Callable[[Request], list[int]],
        config: DaemonConfig,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        link: LinkServer | None = None,
    ):
        self.store = store
        self.engine = engine
        self.encode = encode
        self.config = config
        self.clock = clock  # the daemon's one clock: intervals, heartbeats, wall times it writes
        self.sleep = sleep
        self.held = Holdings()
        self.writer = Writer(store, config.owner, config.model, self.held, engine.text, config.batch_flush_s)
        self.leases = LeaseKeeper(store, engine, config.owner, config.lease_s, self.held,
                                  self.writer.pending_leases)
        self.faults = StepFaults(engine, config.max_attempts)
        self.figures = StepFigures(config.share_half_life_s)
        self.link = link  # servers hear wake-ups and tokens here (None: the table only)
        self.publisher = Publisher(link, self.held, engine.text, config.model, engine.redraws,
                                   self.writer.write_now) if link else None
        if link is not None:
            engine.wake_on(link.wake_fd)  # a step waiting for a remote engine's tokens ends for new work
        self.started_at = clock()
        self.stopping = False
        self._weights: dict[str, float] = {}
        self._weights_applied_at: float | None = None
        self._last_sync = self._last_beat = self._last_sweep = -math.inf
        self._storage_down_since: float | None = None
        self._sync_asked = False  # a server asked for a sync while a step ran: the next pass does it
        self._claim_asked = False  # a claim announced while a step ran that the table failed
        self._unsynced = True  # the table changed (or may have) since the last sync completed
        self.put_off = PutOff(config.sync_interval_s)  # fresh latency work's step before housekeeping

    @property
    def fenced_writes(self) -> int:
        """Writes the queue refused: leases this daemon had lost."""
        return self.writer.fenced

    @property
    def lost_leases(self) -> int:
        """Held requests dropped because another claim took them."""
        return self.leases.lost

    def stop(self) -> None:
        """Ask the loop to end after the current step (signal handlers call this)."""
        self.stopping = True

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        try:
            while not self.stopping and not self.step():
                pass
        finally:
            self.shutdown()

    def start(self) -> None:
        """Before the first pass: take back what a previous daemon left running (alone on the table),
        and say hello."""
        if self.config.exclusive:
            reclaimed = self.store.release()
            if reclaimed:
                log.info("resuming %d request(s) left running by a previous daemon", reclaimed)
        self._beat(force=True)

    def step(self) -> bool:
        """One pass of the loop (what `run` repeats); True when `until_idle` finds nothing left to do.
        A table that fails is tried again at the next pass, within `storage_patience_s`."""
        try:
            done = self._one_pass()
        except StorageError as exc:
            self._storage_trouble(exc)
            return False
        self._storage_down_since = None
        return done

    def _one_pass(self) -> bool:
        """One pass of the loop; True when `until_idle` finds nothing left to do."""
        now = self.clock()
        wants = self.link.take_wake() if self.link is not None else None
        sync_asked, self._sync_asked = self._sync_asked or (wants is not None and wants.sync), False
        announced, self._claim_asked = self._claim_asked or (wants is not None and wants.claim), False
        idle = not self.engine.has_work
        hurry = self.put_off.hurrying
        due = now - self._last_sync >= self.config.sync_interval_s and not hurry
        # The daemon looks at the table only when it may have changed (a cheap check on SQLite; always
        # yes on PostgreSQL): idle, for work at every pass (its heartbeat's own write makes it look once
        # a beat at least); at the due sync, for weights, cancels and work: a sync that would find
        # nothing new (three reads, ten times a second while busy) is not made. Every commit counts,
        # this daemon's own too, and a change seen stays unsynced until a sync is in.
        fresh = (idle or due) and self.store.may_have_changed()
        self._unsynced = self._unsynced or fresh
        if due and not self._unsynced:
            # Nothing committed since the last sync: the table is as that sync left it, as good as a
            # sync made now. The next look comes an interval on, not at every pass until the table
            # changes (a check at each ~20 ms step, each a read of SQLite's shared memory).
            self._last_sync = now
        if sync_asked or (due and self._unsynced):
            self.sync(announced)
        elif announced or (idle and fresh):
            # New work announced, or nothing to do: look for work only (weights and cancels wait for
            # the interval's sync; an idle daemon holds nothing to cancel).
            self.claim(announced)
        if not self.config.exclusive and now - self._last_sweep >= self.config.sweep_s and not hurry:
            self.sweep()
        self.writer.write_completions()
        if not self.engine.has_work:
            self.put_off.idle()
            # On a shared queue, idle means no daemon holds work either: a
            # dead one's requests come back when their leases expire.
            shared = not self.config.exclusive
            if self.config.until_idle and not self.store.has_queued(running_too=shared):
                return True
            self._beat()
            if self.link is not None:
                self.link.wait(self.config.idle_sleep_s)
            else:
                self.sleep(self.config.idle_sleep_s)
            return False
        self.turn()
        return False

    def _storage_trouble(self, exc: StorageError) -> None:
        """The job table failed a call (connection lost, disk full, locked past the timeout).

        Keep what is in memory and try again: completions wait in the
        writer, dirty tokens stay dirty. Only an outage longer than
        `storage_patience_s` ends the daemon (its leases then expire, and
        other daemons, or its successor, resume the work).
        """
        now = self.clock()
        if self._storage_down_since is None:
            self._storage_down_since = now
        down = now - self._storage_down_since
        if down > self.config.storage_patience_s:
            raise exc
        log.warning("job table unavailable (%s); retrying (%.0f s so far)", exc, down)
        self.sleep(min(1.0, self.config.storage_patience_s / 10))

    def turn(self) -> None:
        """One engine step and what follows it: tokens marked, finished requests written."""
        start = self.clock()
        wait_s = step_wait(self, start) if self.engine.waits else None  # the built-in engine never waits
        self.put_off.stepping()
        try:
            report = self.engine.step(wait_s, self.config.late_s)
        except StepFailed as failure:
            self._step_failed(failure)
            return
        now = self.clock()
        announced = self._claim_announced()
        if report is not None:
            self.figures.record(report, now - start, now)
            self.held.stepped(now, report.at)
            self.held.produced(report.tokens)
            if self.publisher is not None:
                self.publisher.step(report.tokens, report.finished, now)
            self.writer.finished(report.finished)
        self._write_step(announced)
        if report is not None and self.publisher is not None:
            self.publisher.written(now)
        if self.put_off.puts_off(now):
            self.writer.after_step(now, batch=False)  # a table-only realtime stream's tokens still go
            return
        self.writer.after_step(now)
        self._beat()

    def _claim_announced(self) -> bool:
        """Whether work was announced during the step (claimed with its writes; a sync asked waits a pass)."""
        wants = self.link.take_wake() if self.link is not None else None
        self._sync_asked = self._sync_asked or bool(wants and wants.sync)
        return bool(wants and wants.claim)

    def _write_step(self, claim: bool) -> None:
        """The step's completions, latency tokens and announced claim in one transaction."""
        self._claim_asked = claim  # until it is in (one the table fails: the writer keeps its writes)
        began = time.time()
        claimed = self.writer.write_step(claim_ask(self) if claim else None)
        self._claim_asked = False
        self.claim(claimed=claimed, began=began)

    def sync(self, announced: bool = False) -> None:
        """Weights, cancels and new work from the job table."""
        self._last_sync = self.clock()
        self._apply_weights(self.store.tenant_weights())
        for request_id in self.store.cancelled_held(self.config.owner) if len(self.held) else ():
            held = self.held.pop(request_id)
            if held is None:
                continue
            text = self.engine.text(held)
            self.engine.cancel(request_id)
            self.writer.cancelled(held, text)
        self.claim(announced)
        self._unsynced = False  # only once the sync is in: one the table fails is done again when due

    def claim(self, announced: bool = False, claimed: list[Request] | None = None, began: float = 0) -> None:
        """New work from the job table, fairly (up to `held_batches` batches held per group; `announced`:
        a server told of new work), or, given, the work a step's transaction claimed (`began`: its
        wall time, for the stamps)."""
        if claimed is None:
            began = time.time()
            ask = claim_ask(self)
            claimed = self.store.claim(self.config.owner, ask.per_group, ask.held, lease_s=ask.lease_s,
                                       announced=announced)
        if claimed:
            crash_point("after_claim")
        for request in claimed:
            stamp("claim_began", request.job_id, began)  # the transaction that claimed it
            stamp("claimed", request.job_id)
            self._admit(request)
        self.put_off.claimed(claimed)

    def _apply_weights(self, weights: dict[str, float]) -> None:
        changed = [tenant for tenant, weight in weights.items() if self._weights.get(tenant) != weight]
        for tenant in changed:
            self.engine.set_weight(tenant, weights[tenant])
        self._weights = weights
        if changed:
            self._weights_applied_at = self._last_sync
            self._beat(force=True)

    def flush(self, everything: bool) -> None:
        """Persist tokens: latency classes every step, batch work when `everything`."""
        self.writer.flush(everything, self.clock())

    def sweep(self) -> None:
        """On a shared queue: requeue expired leases (any daemon's) and share tenants' usage."""
        self._last_sweep = self.clock()
        self.leases.reclaim_expired()
        peers = self.store.exchange_usage(self.config.owner, self.engine.local_usage())
        self.engine.set_peer_usage((p.tenant, p.gpu_s, p.kv_token_s, p.age_s) for p in peers)

    def renew(self) -> None:
        """Extend this daemon's leases; drop, without writing, the requests it lost."""
        self.leases.renew(self.clock())

    def shutdown(self) -> None:
        """Flush every token, hand unfinished requests back to the queue, say goodbye."""
        try:
            self.writer.write_completions()
            self.flush(everything=True)
            self.store.release(self.config.owner)
        finally:
            self._beat(force=True, stopped=True)
            if self.link is not None:
                self.link.close()

    # -- helpers -------------------------------------------------------------------------
    def _admit(self, request: Request) -> None:
        if request.id in self.held:
            # Claimed again after this daemon lost its lease (it stalled, the
            # lease was reclaimed, and it took the request back before its
            # renewal noticed): restart it from the flushed tokens.
            self.leases.drop([request.id])
        try:
            request.encoded(self.encode(request))
        except Exception as exc:  # a request that cannot even be encoded fails alone
            self.writer.failed(request.id, f"cannot prepare the request: {exc}", list(request.output),
                               request.lease_epoch)
            return
        self.held.add(request)
        # its time in the table so far counts toward its first token's wait
        failed = self.engine.add(request, queued_s=self.clock() - request.enqueued_at)
        if failed is not None:
            self.held.pop(request.id)
            self.writer.failed(request.id, failed.error or "rejected", failed.tokens, request.lease_epoch)

    def _step_failed(self, failure: StepFailed) -> None:
        """The engine dropped every request: requeue them, failing those that keep crashing it
        (`stepfaults` says whose fault a failed step is)."""
        log.error("engine step failed: %s", failure)
        dropped = {request_id: held for request_id, held in self.held}
        for request_id in dropped:
            self.held.pop(request_id)
        verdict = self.faults.judge(failure, dropped)
        for request_id, failures in verdict.fail.items():
            self.writer.failed(request_id, f"the model step failed {failures} times with this request "
                                           f"alone in it: {failure}", [], dropped[request_id].lease_epoch)
        # Tokens since the last flush are gone with the engine's state; the
        # requeued requests recompute them, identically (seeded per position).
        self.store.release(self.config.owner, verdict.requeue)

    def _beat(self, force: bool = False, stopped: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_beat < self.config.heartbeat_s:
            return
        self._last_beat = now
        if not stopped:
            self.renew()
        self.store.heartbeat(DaemonSummary(
            id=self.config.owner, host=self.config.host, pid=self.config.pid, device=self.config.device,
            model=self.config.model, started_at=self.started_at, heartbeat_at=now,
            stopped_at=now if stopped else None, stats=heartbeat_stats(self, now),
        ))


def claim_ask(daemon: Daemon) -> ClaimAsk:
    """What the daemon claims now. The batch as it is now: an out-of-memory step lowers it. Holding
    nothing, one batch a group first: the engine starts on it sooner, and the next sync tops up the rest."""
    per_group = (daemon.config.held_batches if len(daemon.held) else 1) * daemon.engine.max_batch
    return ClaimAsk(per_group, daemon.held.per_group(), lease_s=daemon.config.lease_s)


def step_wait(daemon: Daemon, now: float) -> float:
    """How long the engine step starting at `now` may wait for a remote engine's tokens: until the
    loop's next timed duty is `late_s` overdue (core/daemon/duties.py)."""
    config = daemon.config
    return wait_bound(Duties(
        sync_at=daemon._last_sync + config.sync_interval_s,
        beat_at=daemon._last_beat + config.heartbeat_s,
        sweep_at=None if config.exclusive else daemon._last_sweep + config.sweep_s,
        flush_at=daemon.writer.next_flush_at(),
        put_off=daemon.put_off.hurrying,
    ), now, config.sync_interval_s, config.late_s)


def heartbeat_stats(daemon: Daemon, now: float) -> DaemonStats:
    """The figures `fsched status`, `/metrics` and the HTTP server read of a daemon."""
    f, engine = daemon.figures, daemon.engine.snapshot()
    return DaemonStats(
        policy=daemon.config.policy,
        steps=f.steps,
        tokens=f.tokens,
        tok_s=round(f.tok_s, 1),
        step_ms=round(f.step_ms, 2),
        batch=f.batch,
        running=engine.running,
        waiting=engine.waiting,
        held=len(daemon.held),
        kv_tokens=engine.kv_tokens,
        kv_budget=engine.kv_budget,
        served_share={t: round(v, 4) for t, v in f.served_shares(engine.kv_budget, now).items()},
        weights=dict(daemon._weights),
        weights_applied_at=daemon._weights_applied_at,
        lease_s=daemon.config.lease_s,
        fenced_writes=daemon.fenced_writes,
        lost_leases=daemon.lost_leases,
        preemptions=engine.preemptions,
        first_tokens=engine.first_tokens,
        tokens_computed=engine.work.computed,
        tokens_recomputed=engine.work.recomputed,
        tokens_parked=engine.work.parked,
        requests=tuple(engine.requests),
        link=daemon.link.address if daemon.link is not None else None,
    )
