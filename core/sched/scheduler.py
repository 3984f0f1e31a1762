"""The scheduling mechanism: iteration-level admission, chunked prefill,
preemption with checkpointing, minimum quantum, cancellation, accounting.

The engine loop reads::

    plan = scheduler.schedule(now)
    outcome = runner.run(plan)
    scheduler.postprocess(plan, outcome, now)

Time is always passed in; nothing here reads a clock, so every decision is
a function of the scheduler's state and `now`, and the simulator replays
the same object against a cost model. The order is the policy's
(`policy.py`), the choice of victims `preemption.py`'s, the step's
bookkeeping `accounting.py`'s, the plan's shape `planning.py`'s.

Budgets, all enforced in `schedule()`:
* slots: at most `max_batch` running requests;
* KV: the running requests' contexts (prompt + generated, which is what
  they hold after the step) never exceed `kv_tokens`. Admission also keeps
  `min_quantum_steps` slots of decode growth per running request in
  reserve, so a request inside its minimum quantum is never the victim of
  memory pressure;
* tokens: decodes plus prefill chunks never exceed `step_tokens`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from fsched.core.sched.accounting import PrefillStepTimer, WorkTally, apply_step, expected_decode
from fsched.core.sched.backfill import BACKFILL_SCAN, backfills, reserve_for
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.lines import restamp_running, stamp
from fsched.core.sched.plan import Outcome, Plan, Preemption
from fsched.core.sched.planning import compose_plan
from fsched.core.sched.policy import Policy, Standing, make_policy, standings
from fsched.core.sched.preemption import (
    OutsideOrder,
    Room,
    checkpoint_for,
    choose_victims,
    memory_victim,
    slot_frees_soon,
)
from fsched.core.sched.request import Checkpoint, Request
from fsched.core.sched.shares import entitled_shares
from fsched.core.sched.usage import PrecedenceUsage, TenantCharge, TenantMeter
from fsched.core.sched.waitqueue import WaitQueue
from fsched.core.types import RequestId, RequestStatus


@dataclass(slots=True, frozen=True)
class PostprocessResult:
    """What `postprocess` reports: each tenant's charge, and the requests that left."""

    charges: Mapping[str, TenantCharge]
    finished: tuple[RequestId, ...]  # left the running set: done


@dataclass(slots=True)
class _StepBuilder:
    preempted: list[Preemption] = field(default_factory=list)
    resumed: list[RequestId] = field(default_factory=list)
    admitted: list[RequestId] = field(default_factory=list)
    swap_tokens: int = 0
    touched: set[RequestId] = field(default_factory=set)  # preempted or admitted this step
    outside: OutsideOrder | None = None

    def outside_order(self, policy: Policy, running: Mapping[RequestId, Request],
                      config: SchedulerConfig) -> OutsideOrder | None:
        """The pass's victims outside the precedence tier in order (preemption.OutsideOrder), made when
        the pass first preempts; None for a policy without `outside_victims`."""
        if self.outside is None and policy.outside_victims:
            self.outside = OutsideOrder(policy, running, self.admitted, config)
        return self.outside


class Scheduler:
    def __init__(self, config: SchedulerConfig | None = None, policy: Policy | str = "fsched",
                 weights: Mapping[str, float] | None = None) -> None:
        self.config = config or SchedulerConfig()
        if isinstance(policy, str):
            policy = make_policy(policy, self.config, weights or {})
        elif weights:
            for tenant, w in weights.items():
                policy.meter.set_weight(tenant, w)
        self.policy = policy
        self.meter = policy.meter
        self._precedence = PrecedenceUsage.of_config(self.config)
        self._waiting = WaitQueue(policy)
        self._running: dict[RequestId, Request] = {}
        self._live: dict[RequestId, Request] = {}
        self._tenant_live: Counter[str] = Counter()
        self._tenant_waiting: Counter[str] = Counter()
        self._kv_committed = 0  # sum of running contexts
        self._host_used = 0
        self._step = 0
        self._now = 0.0  # latest time seen (cancel() takes none)
        self._seq = itertools.count()
        self.preemptions = 0
        self.work = WorkTally()  # tokens computed, and recomputed or parked by preemptions
        self.prefill_step = PrefillStepTimer()  # when a request's target goes out of reach (lines.py)
        self.backfilled = 0  # admitted behind a head that did not fit
        self._batch_cap = self.config.max_batch  # a temporary limit below max_batch (cap_batch)
        self._batch_cap_until = 0  # ... in force while self._step is below this

    # ------------------------------------------------------------------ views
    @property
    def step(self) -> int:
        return self._step

    @property
    def running(self) -> Mapping[RequestId, Request]:
        return self._running

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    def waiting(self) -> Iterable[Request]:
        return iter(self._waiting)

    @property
    def kv_committed(self) -> int:
        return self._kv_committed

    @property
    def host_used(self) -> int:
        return self._host_used

    def get(self, request_id: RequestId) -> Request | None:
        return self._live.get(request_id)

    def backlogged_tenants(self) -> list[str]:
        """Tenants with work waiting: the ones competing for the next slot."""
        return [t for t, n in self._tenant_waiting.items() if n > 0]

    def standings(self, now: float, scores: Mapping[str, float] | None = None) -> dict[str, Standing]:
        """Every live tenant's standing (score, within its share, precedence) as of `now`."""
        live = [t for t, n in self._tenant_live.items() if n > 0]
        if scores is None:
            scores = self.meter.scores(live, now)
        entitled = entitled_shares({t: self.meter.weight(t) for t in live}, live)
        use = {t: self._precedence.fraction(t, now) for t in live}
        return standings(scores, self.backlogged_tenants(), self.config.share_slack, use, entitled)

    # ---------------------------------------------------------------- changes
    def add(self, r: Request) -> None:
        """Queue a new request; `r.arrival` is the time it arrived."""
        cfg = self.config
        if r.id in self._live:
            raise ValueError(f"request {r.id!r} is already scheduled")
        if r.prompt_tokens + r.max_tokens + cfg.min_quantum_steps > cfg.kv_tokens:
            raise ValueError(f"request {r.id!r} needs {r.prompt_tokens + r.max_tokens} KV slots; "
                             f"the budget is {cfg.kv_tokens}")
        r.status = RequestStatus.WAITING
        r.seq = next(self._seq)
        self._live[r.id] = r
        self._tenant_live[r.tenant] += 1
        self._now = max(self._now, r.arrival)
        self._enqueue(r, r.arrival)

    def _enqueue(self, r: Request, now: float) -> None:
        # A tenant whose queue was empty is lifted to the lowest score among
        # the backlogged tenants (VTC's rule): time spent without waiting
        # work, served or idle, banks no credit for a later burst.
        if self._tenant_waiting[r.tenant] == 0:
            self.meter.activate(r.tenant, self.backlogged_tenants(), now)
        self._tenant_waiting[r.tenant] += 1
        r.wait_since = now
        stamp(r, self.config, self.prefill_step.seconds)
        self._waiting.push(r, now)

    def cancel(self, request_id: RequestId) -> bool:
        """Remove a request from every queue and free what it holds."""
        r = self._live.pop(request_id, None)
        if r is None:
            return False
        if r.status is RequestStatus.RUNNING:
            self._leave_running(r)
        else:
            self._waiting.remove(r, self._now)
            self._tenant_waiting[r.tenant] -= 1
            if r.parked:
                self._host_used -= r.computed
        r.status = RequestStatus.FINISHED_CANCELLED
        self._tenant_live[r.tenant] -= 1
        return True

    def set_weight(self, tenant: str, weight: float) -> None:
        """Takes effect at the next `schedule()`."""
        self.meter.set_weight(tenant, weight)

    def limit_batch(self, max_batch: int) -> None:
        """Change `max_batch` from the next `schedule()` on (validated like any config). Requests
        running beyond a lowered limit are not evicted; none is admitted until the batch is under
        it. The daemon halves the batch this way when a step runs out of device memory."""
        self.config = replace(self.config, max_batch=max_batch)

    def cap_batch(self, rows: int, steps: int) -> None:
        """Admit at most `rows` running requests for the next `steps` steps, then
        `max_batch` again: a temporary limit (the daemon isolates a request that
        crashes the model's step this way)."""
        if rows < 1 or steps < 1:
            raise ValueError("cap_batch needs rows >= 1 and steps >= 1")
        self._batch_cap = rows
        self._batch_cap_until = self._step + steps

    # --------------------------------------------------------------- schedule
    def schedule(self, now: float) -> Plan:
        """Decide the next engine step."""
        self._now = max(self._now, now)
        b = _StepBuilder()
        scores = self.meter.scores([t for t, n in self._tenant_live.items() if n > 0], now)
        stand = self.standings(now, scores)
        cfg = self.config
        while self._kv_committed > cfg.kv_tokens and self._running:
            victim = memory_victim(self._running.values(), self.policy, stand, cfg.min_quantum_steps, now)
            how = checkpoint_for(victim, self._host_free(), cfg) or Checkpoint.RECOMPUTE
            self._preempt(victim, how, b, now)
        stand = self._admit(scores, stand, b, now)
        return self._compose(stand, b, now)

    def _admit(self, scores: dict[str, float], stand: dict[str, Standing], b: _StepBuilder,
               now: float) -> dict[str, Standing]:
        """Admit waiting requests in rank order while they fit or may make room;
        the standings after the admissions."""
        stale = False  # admissions since `stand` was made, none of which could change a pick
        while self._waiting:
            _, cand = self._waiting.best(now, stand)
            if cand.id in b.touched:
                break  # preempted this very step: nothing better fits
            if not self._fits(cand):
                stand, stale = self.standings(now, scores) if stale else stand, False
                if not self._make_room(cand, stand, b, now):
                    if self.policy.backfills and not self.policy.may_preempt(cand, now, stand):
                        stand = self._backfill(cand, scores, stand, b, now)
                    break
            self._start(cand, b)
            reserve(self.meter, cand, scores, now)
            # One tenant's work alone waiting, its standing orders none of it (`Policy.compose`): the
            # standings are made again when a decision reads them, not at each admission of a burst.
            stale = self._waiting.one_standing()
            stand = stand if stale else self.standings(now, scores)
        return self.standings(now, scores) if stale else stand

    def _backfill(self, head: Request, scores: dict[str, float], stand: dict[str, Standing],
                  b: _StepBuilder, now: float) -> dict[str, Standing]:
        """Admit requests behind a blocked `head` that leave its reservation where it was."""
        room = self._room()
        if room.slots < 1:
            return stand
        reservation = reserve_for(head, self._running.values(), self.config, room.slots + len(self._running))
        if reservation is None:
            return stand
        ranked = [r for r in self._waiting.ranked(now, stand, BACKFILL_SCAN) if r.id not in b.touched]
        for cand in backfills(head, ranked, reservation, stand, self.config, self._room):
            self._start(cand, b)
            self.backfilled += 1
            reserve(self.meter, cand, scores, now)
            stand = self.standings(now, scores)
        return stand

    def _room(self) -> Room:
        cfg = self.config
        n = len(self._running)
        cap = self._batch_cap if self._step < self._batch_cap_until else cfg.max_batch
        kv = cfg.kv_tokens - self._kv_committed - (n + 1) * cfg.min_quantum_steps
        return Room(min(cap, cfg.max_batch) - n, kv, self._host_free())

    def _host_free(self) -> int:
        return self.config.host_kv_tokens - self._host_used

    def _fits(self, cand: Request) -> bool:
        room = self._room()
        return room.slots >= 1 and room.kv_tokens >= cand.context

    def _make_room(self, cand: Request, stand: Mapping[str, Standing], b: _StepBuilder,
                   now: float) -> bool:
        """Preempt for `cand` when the policy lets it and it pays; whether it now fits."""
        policy = self.policy
        if not (policy.preemptive and policy.may_preempt(cand, now, stand)):
            return False
        room = self._room()
        if slot_frees_soon(self._running.values(), policy.grace(cand, now), cand.context, room.kv_tokens):
            return False  # a running request leaves within the grace: wait for its slot
        victims = choose_victims(cand, self._running.values(), room, cand.context, policy, stand,
                                 self.config, b.outside_order(policy, self._running, self.config))
        if not victims:
            return False
        for victim, checkpoint in victims:
            self._preempt(victim, checkpoint, b, now)
        return self._fits(cand)

    def _start(self, r: Request, b: _StepBuilder) -> None:
        self._waiting.take(r, self._now)
        self._tenant_waiting[r.tenant] -= 1
        if r.parked:
            self._host_used -= r.computed
            b.resumed.append(r.id)
            b.swap_tokens += r.computed
        r.status = RequestStatus.RUNNING
        r.run_steps = r.idle_steps = 0
        self._running[r.id] = r
        self._kv_committed += r.context
        b.admitted.append(r.id)
        b.touched.add(r.id)

    def _leave_running(self, r: Request) -> None:
        if r.res_gpu or r.res_kv:
            self.meter.release(r.tenant, r.res_gpu, r.res_kv)
        r.res_gpu = r.res_kv = 0.0
        del self._running[r.id]
        self._kv_committed -= r.context

    def _preempt(self, r: Request, checkpoint: Checkpoint, b: _StepBuilder, now: float) -> None:
        self._leave_running(r)
        kv = r.computed
        if checkpoint is Checkpoint.PARK and kv > 0:
            self._host_used += kv  # parked: preempted with its KV computed (see `parked`)
            b.swap_tokens += kv
            self.work.parked += kv
        else:
            checkpoint = Checkpoint.RECOMPUTE
            r.computed = 0
            self.work.recomputed += kv
        b.preempted.append(Preemption(r.id, checkpoint, kv))
        b.touched.add(r.id)
        r.status = RequestStatus.PREEMPTED
        r.preemptions += 1
        self.preemptions += 1
        self._enqueue(r, now)

    def _compose(self, stand: Mapping[str, Standing], b: _StepBuilder, now: float) -> Plan:
        rank, policy = self.policy.running_rank, self.policy
        restamp_running(self._running.values(), self.config, self.prefill_step.seconds)  # on_target
        due = (lambda r: policy.due(r, now)) if self.config.cut_prefill_for_first_token else None
        return compose_plan(self._step, self._running.values(), lambda r: rank(r, stand, now), self.config,
                            (b.preempted, b.resumed, b.admitted), self._kv_committed, b.swap_tokens,
                            quantum_ends=len(self._waiting) > 0 and self.policy.preemptive, due=due)

    # ------------------------------------------------------------ postprocess
    def postprocess(self, plan: Plan, outcome: Outcome, now: float) -> PostprocessResult:
        """Apply what the engine did; `now` is the time the step(s) ended.

        Returns the requests that finished (the engine's and those that
        reached max_tokens) and what each tenant consumed, as charged to the
        usage meter (see `accounting.py`).
        """
        if outcome.steps < 1 or (outcome.steps > 1 and plan.prefill):
            raise ValueError("only decode-only plans may be repeated")
        totals = apply_step(self._running.values(), plan, outcome)
        charges: dict[str, TenantCharge] = {}
        for tenant, t in totals.items():
            charges[tenant] = t.charge
            self.work.computed += t.charge.prefill_tokens + t.charge.decode_tokens
            self._kv_committed += t.generated
            if t.reserved_gpu_s or t.reserved_kv_token_s:
                self.meter.release(tenant, t.reserved_gpu_s, t.reserved_kv_token_s)
        finished = [rid for rid in outcome.finished if rid in self._running]
        finished += [r.id for r in self._running.values()
                     if r.generated >= r.max_tokens and r.id not in outcome.finished]
        for rid in finished:
            self._finish(self._running[rid])
        self._step += outcome.steps
        self.prefill_step.observe(plan, outcome)
        self.meter.charge(charges, outcome.elapsed_s, now, outcome.steps)
        self._precedence.charge({t: s.precedence for t, s in totals.items()}, outcome.elapsed_s, now)
        return PostprocessResult(charges, tuple(finished))

    def _finish(self, r: Request) -> None:
        self._leave_running(r)
        if not r.status.is_finished:  # the engine sets why a request it stopped stopped
            r.status = RequestStatus.FINISHED_LENGTH if r.generated >= r.max_tokens \
                else RequestStatus.FINISHED_STOPPED
        del self._live[r.id]
        self._tenant_live[r.tenant] -= 1


def reserve(meter: TenantMeter, r: Request, scores: dict[str, float], now: float) -> None:
    """Reserve an admitted request's work in its tenant's score (`scores` moved to it)."""
    prefill = r.pending_prefill
    r.res_gpu, r.res_kv = meter.reserve(r.tenant, r.context, prefill, expected_decode(r))
    scores[r.tenant] = meter.provisional(scores[r.tenant], r.tenant, prefill, now)
