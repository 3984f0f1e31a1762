"""The daemon loop: the job table feeds the engine, the engine's tokens go back to it.

No SQL and no torch here: the store is any JobStore, the engine is passed
in, and `encode` turns a claimed request into token ids. The loop never
holds a database transaction across a model step: every store call is its
own short transaction between steps.

Each turn:
1. every `sync_interval_s`: apply weight changes, stop requests whose job
   was cancelled, claim new work fairly (up to `claim_per_group` held per
   tenant and class);
2. one engine step;
3. persist tokens: realtime and streaming requests every step, batch ones
   at least every `batch_flush_s`; a finished request's output and its
   final state in one transaction;
4. every `heartbeat_s`: the daemon's row with its engine figures.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fsched.core.faults import crash_point
from fsched.core.sched.explain import explain
from fsched.core.sched.usage import peer_totals
from fsched.core.serve.engine import Engine, EngineRequest, EngineResult, StepFailed, StepReport
from fsched.core.store import ClaimedRequest, Completion, DaemonSummary, JobStore, StorageError, TokenUpdate
from fsched.core.types import RequestClass, RequestState, SamplingParams

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
    claim_per_group: int = 64
    max_attempts: int = 3
    until_idle: bool = False
    exclusive: bool = True  # the only daemon on this job table (SQLite): it may reclaim everything
    share_half_life_s: float = 10.0  # of the served-share figures shown by status
    # Several daemons on one queue (PostgreSQL): a lease lasts `lease_s`
    # unless renewed (every heartbeat); every `sweep_s` a daemon requeues
    # requests whose lease expired, and shares its tenants' usage.
    lease_s: float = 10.0
    sweep_s: float = 1.0
    storage_patience_s: float = 60.0  # how long the job table may fail before the daemon gives up

    def __post_init__(self) -> None:
        for name in ("sync_interval_s", "batch_flush_s", "heartbeat_s", "share_half_life_s", "lease_s",
                     "sweep_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be > 0")
        if self.claim_per_group < 1 or self.max_attempts < 1:
            raise ValueError("claim_per_group and max_attempts must be >= 1")
        if self.lease_s <= 2 * self.heartbeat_s:
            raise ValueError("lease_s must be more than two heartbeats, or live daemons lose their leases")


@dataclass(slots=True)
class _Held:
    claimed: ClaimedRequest
    first_token_at: float | None = None
    dirty: bool = False

    @property
    def epoch(self) -> int:
        return self.claimed.lease_epoch


@dataclass(slots=True)
class DaemonStats:
    """Engine figures for the heartbeat (decayed averages, so they follow the load)."""

    steps: int = 0
    tokens: int = 0
    tok_s: float = 0.0
    step_ms: float = 0.0
    batch: int = 0
    kv_tokens: int = 0
    served: dict[str, list[float]] = field(default_factory=dict)  # tenant -> [gpu_s, kv_token_s]
    last_decay: float = 0.0

    def record(self, report: StepReport, wall_s: float, now: float, half_life_s: float) -> None:
        self.steps += 1
        self.tokens += report.token_count
        alpha = 0.1
        self.step_ms += alpha * (report.elapsed_s * 1000 - self.step_ms)
        rate = report.token_count / wall_s if wall_s > 0 else 0.0
        self.tok_s += alpha * (rate - self.tok_s)
        self.batch, self.kv_tokens = report.batch_size, report.kv_tokens
        factor = 0.5 ** ((now - self.last_decay) / half_life_s) if self.last_decay else 1.0
        self.last_decay = now
        for usage in self.served.values():
            usage[0] *= factor
            usage[1] *= factor
        for tenant, charge in report.charges.items():
            usage = self.served.setdefault(tenant, [0.0, 0.0])
            usage[0] += charge.gpu_s
            usage[1] += charge.kv_token_s

    def served_shares(self) -> dict[str, float]:
        """Each tenant's part of the dominant resource recently served (sums to 1)."""
        return served_shares(self.served)


def served_shares(served: dict[str, list[float]]) -> dict[str, float]:
    """Normalised dominant shares: max over resources of the tenant's fraction of it."""
    totals = [sum(u[i] for u in served.values()) for i in range(2)]
    dominant = {
        t: max((u[i] / totals[i]) if totals[i] else 0.0 for i in range(2)) for t, u in served.items()
    }
    total = sum(dominant.values())
    return {t: d / total for t, d in dominant.items()} if total else {}


class Daemon:
    def __init__(
        self,
        store: JobStore,
        engine: Engine,
        encode: Callable[[ClaimedRequest], list[int]],
        config: DaemonConfig,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.engine = engine
        self.encode = encode
        self.config = config
        self.clock = clock
        self.held: dict[int, _Held] = {}
        self.stats = DaemonStats()
        self.started_at = clock()
        self.stopping = False
        self._weights: dict[str, float] = {}
        self._weights_applied_at: float | None = None
        self._step_failures: dict[int, int] = {}
        self._last_sync = self._last_batch_flush = self._last_beat = self._last_sweep = -math.inf
        self.fenced_writes = 0  # writes the job table refused: leases this daemon had lost
        self._unwritten: list[Completion] = []  # finished in the engine, not yet in the table
        self._storage_down_since: float | None = None
        self.lost_leases = 0

    def stop(self) -> None:
        """Ask the loop to end after the current step (signal handlers call this)."""
        self.stopping = True

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        if self.config.exclusive:
            reclaimed = self.store.release()
            if reclaimed:
                log.info("resuming %d request(s) left running by a previous daemon", reclaimed)
        self._beat(force=True)
        try:
            while not self.stopping:
                try:
                    if self._serve_once():
                        break
                    self._storage_down_since = None
                except StorageError as exc:
                    self._storage_trouble(exc)
        finally:
            self.shutdown()

    def _serve_once(self) -> bool:
        """One pass of the loop; True when `until_idle` finds nothing left to do."""
        now = self.clock()
        if now - self._last_sync >= self.config.sync_interval_s or not self.engine.has_work:
            self.sync()
        if not self.config.exclusive and now - self._last_sweep >= self.config.sweep_s:
            self.sweep()
        if self._unwritten:
            self._write_completions()
        if not self.engine.has_work:
            # On a shared queue, idle means no daemon holds work either: a
            # dead one's requests come back when their leases expire.
            shared = not self.config.exclusive
            if self.config.until_idle and not self.store.has_queued(running_too=shared):
                return True
            self._beat()
            time.sleep(self.config.idle_sleep_s)
            return False
        self.turn()
        return False

    def _storage_trouble(self, exc: StorageError) -> None:
        """The job table failed a call (connection lost, disk full, locked past the timeout).

        Keep what is in memory and try again: completions wait in
        `_unwritten`, dirty tokens stay dirty. Only an outage longer than
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
        time.sleep(min(1.0, self.config.storage_patience_s / 10))

    def turn(self) -> None:
        """One engine step and what follows it."""
        start = self.clock()
        try:
            report = self.engine.step()
        except StepFailed as failure:
            self._step_failed(failure)
            return
        now = self.clock()
        if report is not None:
            self.stats.record(report, now - start, now, self.config.share_half_life_s)
            for rid in report.tokens:
                held = self.held.get(int(rid))
                if held is not None:
                    held.dirty = True
                    if held.first_token_at is None:
                        held.first_token_at = now
            self._finish(report.finished)
        self.flush(everything=now - self._last_batch_flush >= self.config.batch_flush_s)
        self._beat()

    def sync(self) -> None:
        """Weights, cancels and new work from the job table."""
        self._last_sync = self.clock()
        weights = self.store.tenant_weights()
        changed = False
        for tenant, weight in weights.items():
            if self._weights.get(tenant) != weight:
                self.engine.scheduler.set_weight(tenant, weight)
                changed = True
        self._weights = weights
        if changed:
            self._weights_applied_at = self._last_sync
            self._beat(force=True)
        for request_id in self.store.cancelled_held(self.config.owner):
            held = self.held.pop(request_id, None)
            if held is None:
                continue
            tokens, text = self.engine.output(str(request_id))
            self.engine.cancel(str(request_id))
            self.store.finish_request(request_id, RequestState.CANCELLED, tokens, text,
                                      owner=self.config.owner, first_token_at=held.first_token_at,
                                      epoch=held.epoch)
        held_per_group: dict[tuple[str, RequestClass], int] = {}
        for h in self.held.values():
            group = (h.claimed.tenant, h.claimed.request_class)
            held_per_group[group] = held_per_group.get(group, 0) + 1
        # Hold no more than twice the batch, as it is now (an out-of-memory step lowers it):
        # what a daemon holds, other daemons cannot run.
        per_group = min(self.config.claim_per_group, 2 * self.engine.scheduler.config.max_batch)
        claimed_now = self.store.claim(self.config.owner, per_group, held_per_group,
                                       lease_s=self.config.lease_s)
        if claimed_now:
            crash_point("after_claim")
        for claimed in claimed_now:
            self._admit(claimed)

    def flush(self, everything: bool) -> None:
        """Persist tokens: latency classes every step, batch work when `everything`."""
        updates = []
        for request_id, held in self.held.items():
            if not held.dirty:
                continue
            if not everything and held.claimed.request_class is RequestClass.BATCH:
                continue
            tokens, text = self.engine.output(str(request_id))
            updates.append(TokenUpdate(request_id, tuple(tokens), text, held.first_token_at, held.epoch))
        if everything:
            self._last_batch_flush = self.clock()
        written = self.store.flush_tokens(self.config.owner, updates)
        for update in updates:  # only now: a failed write leaves them dirty, to be retried
            if (held := self.held.get(update.request_id)) is not None:
                held.dirty = False
        self.fenced_writes += len(updates) - written
        if written:
            crash_point("after_flush")

    def sweep(self) -> None:
        """On a shared queue: requeue expired leases (any daemon's) and share tenants' usage."""
        self._last_sweep = self.clock()
        reclaimed = self.store.reclaim_expired()
        if reclaimed:
            log.warning("requeued %d request(s) whose lease expired (a daemon died or stalled)", reclaimed)
        meter = self.engine.scheduler.meter
        now = self.engine.clock()
        peers = self.store.exchange_usage(self.config.owner, meter.local_usage(now))
        rows = ((p.tenant, p.gpu_s, p.kv_token_s, p.age_s) for p in peers)
        meter.set_peer_usage(peer_totals(rows, self.engine.scheduler.config.usage_half_life_s), now)

    def renew(self) -> None:
        """Extend this daemon's leases; drop, without writing, the requests it lost."""
        leases = {rid: h.epoch for rid, h in self.held.items()}
        leases |= {c.request_id: c.epoch for c in self._unwritten if c.epoch is not None}
        kept = self.store.renew_leases(self.config.owner, leases, self.config.lease_s)
        lost = set(leases) - kept
        if lost:
            self._drop(lost)
            log.warning("lost the lease of %d request(s) (this daemon stalled past its lease); "
                        "another daemon resumes them", len(lost))

    def _drop(self, request_ids) -> None:
        for request_id in request_ids:
            if self.held.pop(request_id, None) is not None:
                self.engine.cancel(str(request_id))
                self.lost_leases += 1

    def shutdown(self) -> None:
        """Flush every token, hand unfinished requests back to the queue, say goodbye."""
        try:
            self._write_completions()
            self.flush(everything=True)
            self.store.release(self.config.owner)
        finally:
            self._beat(force=True, stopped=True)

    # -- helpers -------------------------------------------------------------------------
    def _admit(self, claimed: ClaimedRequest) -> None:
        if claimed.id in self.held:
            # Claimed again after this daemon lost its lease (it stalled, the
            # lease was reclaimed, and it took the request back before its
            # renewal noticed): restart it from the flushed tokens.
            self._drop([claimed.id])
        try:
            prompt = self.encode(claimed)
            request = EngineRequest(
                id=str(claimed.id),
                prompt=prompt,
                params=SamplingParams.from_json(claimed.params),
                tenant=claimed.tenant,
                cls=claimed.request_class,
                priority=claimed.priority,
                generated=list(claimed.output_tokens),
            )
        except Exception as exc:  # a request that cannot even be encoded fails alone
            self._fail(claimed.id, f"cannot prepare the request: {exc}", list(claimed.output_tokens),
                       claimed.lease_epoch)
            return
        self.held[claimed.id] = _Held(claimed)
        failed = self.engine.add(request)
        if failed is not None:
            self.held.pop(claimed.id, None)
            self._fail(claimed.id, failed.error or "rejected", failed.tokens, claimed.lease_epoch)

    def _finish(self, results: list[EngineResult]) -> None:
        """Write the step's finished requests, output and final state, in one transaction."""
        completions = []
        for result in results:
            held = self.held.pop(int(result.id), None)
            if held is None:
                continue
            if result.finish_reason is None:
                completions.append(Completion(int(result.id), RequestState.FAILED, tuple(result.tokens),
                                              error=result.error or "failed", model=self.config.model,
                                              epoch=held.epoch))
            else:
                completions.append(Completion(
                    int(result.id), RequestState.DONE, tuple(result.tokens), result.text,
                    finish_reason=result.finish_reason.value, prompt_tokens=result.prompt_tokens,
                    model=self.config.model, first_token_at=held.first_token_at, epoch=held.epoch,
                ))
        self._unwritten.extend(completions)
        self._write_completions()

    def _write_completions(self) -> None:
        """Write finished requests, output and final state, in one transaction (kept on failure)."""
        if not self._unwritten:
            return
        outcome = self.store.finish_requests(self._unwritten, self.config.owner)
        self._unwritten = []
        # A refused completion: the request already ended, or this daemon lost its lease.
        self.fenced_writes += outcome.count(False)

    def _fail(self, request_id: int, error: str, tokens: list[int], epoch: int | None = None) -> None:
        self.store.finish_request(request_id, RequestState.FAILED, tokens, "", error=error,
                                  model=self.config.model, owner=self.config.owner, epoch=epoch)

    def _step_failed(self, failure: StepFailed) -> None:
        """The engine dropped every request: requeue them, failing those that keep crashing it.

        Whose fault was it? A step with one request in it is that request's:
        it counts against it, and `max_attempts` such steps fail it. A step
        with several could be any one's, or none's (a transient fault):

        - Out of memory (torch.cuda.OutOfMemoryError, MemoryError): the batch
          was too big. Halve it for the rest of the run (`_shrink_batch`) and
          count nothing against anyone; a request that runs out of memory
          alone does not fit at all, and fails after `max_attempts`.
        - Any other error: counting it against every request in the step
          would fail a poison request's batch mates with it (they are claimed
          and batched together again, and all reached `max_attempts` at
          once). So it counts against no one, and the batch is capped at half
          the failed step's size for a while (`_isolate`): a request that
          keeps failing steps ends up alone in one within log2(max batch)
          failures, and then counts.

        Only the failed steps a request was in count, not its claims: a request
        reclaimed after a daemon crash has not crashed anything.
        """
        log.error("engine step failed: %s", failure)
        involved = {int(rid) for rid in failure.request_ids}
        out_of_memory = self._out_of_memory(failure.error)
        if len(involved) > 1:
            if out_of_memory:
                self._shrink_batch(len(involved))
            else:
                self._isolate(len(involved))
        requeue = []
        for request_id, held in list(self.held.items()):
            del self.held[request_id]
            if len(involved) == 1 and request_id in involved:
                self._step_failures[request_id] = self._step_failures.get(request_id, 0) + 1
            failures = self._step_failures.get(request_id, 0)
            if failures >= self.config.max_attempts:
                del self._step_failures[request_id]
                self._fail(request_id, f"the model step failed {failures} times with this request "
                                       f"alone in it: {failure}", [], held.epoch)
            else:
                requeue.append(request_id)
        # Tokens since the last flush are gone with the engine's state; the
        # requeued requests recompute them, identically (seeded per position).
        self.store.release(self.config.owner, requeue)

    def _beat(self, force: bool = False, stopped: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_beat < self.config.heartbeat_s:
            return
        self._last_beat = now
        if not stopped:
            self.renew()
        s = self.stats
        stats = {
            "policy": self.config.policy,
            "steps": s.steps,
            "tokens": s.tokens,
            "tok_s": round(s.tok_s, 1),
            "step_ms": round(s.step_ms, 2),
            "batch": s.batch,
            "running": len(self.engine.scheduler.running),
            "waiting": self.engine.scheduler.waiting_count,
            "held": len(self.held),
            "kv_tokens": s.kv_tokens,
            "kv_budget": self.engine.scheduler.config.kv_tokens,
            "served_share": {t: round(v, 4) for t, v in s.served_shares().items()},
            "weights": self._weights,
            "weights_applied_at": self._weights_applied_at,
            "lease_s": self.config.lease_s,
            "fenced_writes": self.fenced_writes,
            "lost_leases": self.lost_leases,
            "requests": explain(self.engine.scheduler, self.engine.clock()),
        }
        self.store.heartbeat(DaemonSummary(
            id=self.config.owner, host=self.config.host, pid=self.config.pid, device=self.config.device,
            model=self.config.model, started_at=self.started_at, heartbeat_at=now,
            stopped_at=now if stopped else None, stats=stats,
        ))

    # -- faults of the model step (helpers of _step_failed) ------------------------------
    @staticmethod
    def _out_of_memory(error: BaseException) -> bool:
        """torch.cuda.OutOfMemoryError (known by name: core does not import torch) or MemoryError."""
        if isinstance(error, MemoryError):
            return True
        return any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__)

    def _shrink_batch(self, failed_batch: int) -> None:
        """Halve the batch that ran out of memory, for the rest of the run (floor 1)."""
        scheduler = self.engine.scheduler
        before = scheduler.config.max_batch
        after = max(1, min(before, failed_batch) // 2)
        if after < before:
            scheduler.limit_batch(after)
            log.warning("out of memory with %d requests in the step: max batch %d -> %d for the rest "
                        "of this run; the requests are requeued, no attempt counted",
                        failed_batch, before, after)

    def _isolate(self, failed_batch: int, steps: int = 200) -> None:
        """Cap the batch at half the failed step's size for the next `steps` steps."""
        rows = max(1, failed_batch // 2)
        self.engine.scheduler.cap_batch(rows, steps)
        log.warning("a step with %d requests failed; at most %d a step for the next %d steps, "
                    "to find the request that fails it", failed_batch, rows, steps)
