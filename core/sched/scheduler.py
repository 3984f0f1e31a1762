"""The scheduling mechanism: iteration-level admission, chunked prefill,
preemption with checkpointing, minimum quantum, cancellation, accounting.

The engine loop reads (DESIGN §7.2)::

    plan = scheduler.schedule(now)
    outcome = runner.run(plan)
    scheduler.postprocess(plan, outcome, now)

Time is always passed in; nothing here reads a clock, so every decision is
a function of the scheduler's state and `now`, and the simulator replays
the same object against a cost model.

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

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome, Plan, Preemption, PrefillChunk
from fsched.core.sched.policy import INF, Policy, make_policy
from fsched.core.sched.request import Checkpoint, SchedRequest
from fsched.core.sched.usage import TenantCharge
from fsched.core.sched.waitqueue import WaitQueue
from fsched.core.types import RequestClass, RequestState


def demote(level: int, level_tokens: int, produced: int, quanta: tuple[int, ...]):
    """MLFQ demotion: (level, tokens used at it) after decoding `produced` tokens."""
    level_tokens += produced
    while level < len(quanta) and level_tokens >= quanta[level]:
        level_tokens -= quanta[level]
        level += 1
    return level, level_tokens


def expected_work(
    r: SchedRequest, quanta: tuple[int, ...], mean_output: float = 0.0
) -> tuple[int, int]:
    """(prefill, decode) tokens an admitted request is expected to process:
    what is left to prefill, and the longer of the rest of its level's
    quantum (the last level: one more last-level quantum) and the mean
    output length seen so far, capped by max_tokens."""
    quantum = quanta[r.level] - r.level_tokens if r.level < len(quanta) else quanta[-1]
    decode = max(quantum, int(mean_output) - r.generated)
    return r.pending_prefill, min(r.remaining_tokens, decode)


def should_stop(r: SchedRequest) -> bool:
    """The scheduler's own stop check: max_tokens reached (EOS/stop come from the engine)."""
    return r.generated >= r.max_tokens


@dataclass(slots=True, frozen=True)
class StepResult:
    charges: Mapping[str, TenantCharge]
    finished: tuple[str, ...]  # left the running set: done


@dataclass(slots=True)
class _StepBuilder:
    preempted: list[Preemption] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    swap_tokens: int = 0
    touched: set[str] = field(default_factory=set)  # preempted or admitted this step


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig | None = None,
        policy: Policy | str = "fsched",
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        if isinstance(policy, str):
            policy = make_policy(policy, self.config, weights or {})
        elif weights:
            for tenant, w in weights.items():
                policy.meter.set_weight(tenant, w)
        self.policy = policy
        self.meter = policy.meter
        self._waiting = WaitQueue(policy)
        self._running: dict[str, SchedRequest] = {}
        self._live: dict[str, SchedRequest] = {}
        self._tenant_live: Counter[str] = Counter()
        self._tenant_waiting: Counter[str] = Counter()
        # Requests per class band, waiting and running: a cheap test of
        # whether any preemption is possible before searching for a victim.
        self._waiting_bands = [0] * len(RequestClass)
        self._running_bands = [0] * len(RequestClass)
        self._kv_committed = 0  # sum of running contexts
        self._host_used = 0
        self._step = 0
        self._now = 0.0  # latest time seen (cancel() takes none)
        self._mean_output = 0.0  # running mean of output tokens of finished requests
        self._seq = itertools.count()
        self.preemptions = 0
        self._batch_cap = self.config.max_batch  # a temporary limit below max_batch (cap_batch)
        self._batch_cap_until = 0  # ... in force while self._step is below this

    # ------------------------------------------------------------------ views
    @property
    def step(self) -> int:
        return self._step

    @property
    def running(self) -> Mapping[str, SchedRequest]:
        return self._running

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    def waiting(self) -> Iterable[SchedRequest]:
        return iter(self._waiting)

    @property
    def kv_committed(self) -> int:
        return self._kv_committed

    @property
    def host_used(self) -> int:
        return self._host_used

    def get(self, request_id: str) -> SchedRequest | None:
        return self._live.get(request_id)

    def backlogged_tenants(self) -> list[str]:
        """Tenants with work waiting: the ones competing for the next slot."""
        return [t for t, n in self._tenant_waiting.items() if n > 0]

    # ---------------------------------------------------------------- changes
    def add(self, r: SchedRequest) -> None:
        """Queue a new request; `r.arrival` is the time it arrived."""
        cfg = self.config
        if r.id in self._live:
            raise ValueError(f"request {r.id!r} is already scheduled")
        if r.prompt_tokens + r.max_tokens + cfg.min_quantum_steps > cfg.kv_tokens:
            raise ValueError(
                f"request {r.id!r} needs {r.prompt_tokens + r.max_tokens} KV slots; "
                f"the budget is {cfg.kv_tokens}"
            )
        r.state = RequestState.QUEUED
        r.seq = next(self._seq)
        r.wait_since = r.arrival
        r.level = r.admit_level = cfg.entry_level(r.prompt_tokens)
        r.level_tokens = 0
        self._live[r.id] = r
        self._tenant_live[r.tenant] += 1
        self._now = max(self._now, r.arrival)
        self._enqueue(r, r.arrival)

    def _enqueue(self, r: SchedRequest, now: float) -> None:
        # A tenant whose queue was empty is lifted to the lowest score among
        # the backlogged tenants (VTC's rule): time spent without waiting
        # work, served or idle, banks no credit for a later burst.
        if self._tenant_waiting[r.tenant] == 0:
            self.meter.activate(r.tenant, self.backlogged_tenants(), now)
        self._tenant_waiting[r.tenant] += 1
        self._waiting_bands[r.cls.band] += 1
        self._waiting.push(r, now)

    def cancel(self, request_id: str) -> bool:
        """Remove a request from every queue and free what it holds."""
        r = self._live.pop(request_id, None)
        if r is None:
            return False
        if r.state is RequestState.RUNNING:
            self._release(r)
            del self._running[r.id]
            self._running_bands[r.cls.band] -= 1
            self._kv_committed -= r.context
        else:
            self._waiting.remove(r, self._now)
            self._tenant_waiting[r.tenant] -= 1
            self._waiting_bands[r.cls.band] -= 1
            if r.parked:
                self._host_used -= r.computed
                r.parked = False
        r.state = RequestState.CANCELLED
        self._tenant_live[r.tenant] -= 1
        return True

    def set_weight(self, tenant: str, weight: float) -> None:
        """Takes effect at the next `schedule()`."""
        self.meter.set_weight(tenant, weight)

    def limit_batch(self, max_batch: int) -> None:
        """Change `max_batch` from the next `schedule()` on (validated like any config).

        Requests running beyond a lowered limit are not evicted; none is
        admitted until the batch is under it. The daemon halves the batch
        this way when a step runs out of device memory.
        """
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
        scores = self.meter.scores(self._tenant_live, now)
        b = _StepBuilder()
        self._relieve_memory(scores, b, now)
        self._admit(scores, b, now)
        return self._compose(scores, b, now)

    def _relieve_memory(self, scores: dict[str, float], b: _StepBuilder, now: float) -> None:
        while self._kv_committed > self.config.kv_tokens and self._running:
            victim = self._victim(scores) or self._victim(scores, respect_quantum=False)
            self._preempt(victim, b, now)

    def _admit(self, scores: dict[str, float], b: _StepBuilder, now: float) -> None:
        policy = self.policy
        while self._waiting:
            _, cand = self._waiting.best(now, scores)
            if cand.id in b.touched:
                return  # preempted this very step: nothing better fits
            if not self._fits(cand):
                if not policy.preemptive:
                    return
                cand = self._make_room(cand, scores, b, now)
                if cand is None:
                    return
            self._start(cand, b)
            prefill, decode = expected_work(cand, self.config.quanta, self._mean_output)
            cand.res_gpu, cand.res_kv = self.meter.reserve(cand.tenant, cand.context, prefill, decode)
            scores[cand.tenant] = self.meter.provisional(
                scores[cand.tenant], cand.tenant, prefill, now
            )

    def _make_room(self, head: SchedRequest, scores: dict[str, float], b: _StepBuilder,
                   now: float) -> SchedRequest | None:
        """Preempt for the best waiter allowed to displace the last-ranked runner.

        That is the queue's head unless the head is aged work of the
        victim's own class; then the best waiter of a better class (or
        level) goes in, and the head keeps its place for the next free slot.
        Returns the request that now fits, or None.
        """
        policy = self.policy
        best_waiting = next((b for b, n in enumerate(self._waiting_bands) if n), len(RequestClass))
        worst_running = max((b for b, n in enumerate(self._running_bands) if n), default=-1)
        if best_waiting > worst_running or (
            best_waiting == worst_running and not policy.preempts_within(worst_running)
        ):
            return None  # no waiter outranks any runner by class: nothing to search
        victim = self._victim(scores)
        if victim is None:
            return None
        cand = head
        if not policy.may_preempt(head, victim):
            cand = self._best_preempting(victim, scores, now)
            if cand is None or cand.id in b.touched:
                return None
        while True:
            self._preempt(victim, b, now)
            if self._fits(cand):
                return cand
            victim = self._victim(scores)
            if victim is None or not policy.may_preempt(cand, victim):
                return None

    def _best_preempting(self, victim: SchedRequest, scores: dict[str, float], now: float):
        """The best waiter allowed to displace `victim`: of a better class,
        or of its class when the policy slices time there."""
        policy, band = self.policy, victim.cls.band
        found = [self._waiting.best(now, scores, below_band=band)]
        if policy.preempts_within(band, victim):
            found.append(
                self._waiting.best_in_band(now, scores, band, lambda w: policy.may_preempt(w, victim))
            )
        found = [f for f in found if f is not None and policy.may_preempt(f[1], victim)]
        return min(found, key=lambda f: f[0])[1] if found else None

    def _fits(self, cand: SchedRequest) -> bool:
        cfg = self.config
        n = len(self._running) + 1
        if n > cfg.max_batch or (n > self._batch_cap and self._step < self._batch_cap_until):
            return False
        reserve = n * cfg.min_quantum_steps
        return self._kv_committed + cand.context + reserve <= cfg.kv_tokens

    def _victim(self, scores: Mapping[str, float], respect_quantum: bool = True):
        """The last-ranked running request (that has run its minimum quantum)."""
        mq = self.config.min_quantum_steps
        rank = self.policy.running_rank
        worst, worst_rank = None, None
        for r in self._running.values():
            if respect_quantum and r.run_steps < mq:
                continue
            r_rank = rank(r, scores)
            if worst is None or r_rank > worst_rank:
                worst, worst_rank = r, r_rank
        return worst

    def _start(self, r: SchedRequest, b: _StepBuilder) -> None:
        # Before the pop: the group's next head is re-filed with its age
        # counted from this admission.
        self.policy.note_admitted(r, self._now)
        self._waiting.pop_head(r, self._now)
        self._tenant_waiting[r.tenant] -= 1
        self._waiting_bands[r.cls.band] -= 1
        self._running_bands[r.cls.band] += 1
        if r.parked:
            self._host_used -= r.computed
            r.parked = False
            b.resumed.append(r.id)
            b.swap_tokens += r.computed
        r.state = RequestState.RUNNING
        r.run_steps = r.idle_steps = 0
        r.admit_level = r.level
        self._running[r.id] = r
        self._kv_committed += r.context
        b.admitted.append(r.id)
        b.touched.add(r.id)

    def _release(self, r: SchedRequest) -> None:
        if r.res_gpu or r.res_kv:
            self.meter.release(r.tenant, r.res_gpu, r.res_kv)
        r.res_gpu = r.res_kv = 0.0

    def _preempt(self, r: SchedRequest, b: _StepBuilder, now: float) -> None:
        self._release(r)
        del self._running[r.id]
        self._running_bands[r.cls.band] -= 1
        self._kv_committed -= r.context
        kv = r.computed
        if kv > 0 and self._host_used + kv <= self.config.host_kv_tokens:
            checkpoint = Checkpoint.PARK
            self._host_used += kv
            r.parked = True
            b.swap_tokens += kv
        else:
            checkpoint = Checkpoint.RECOMPUTE
            r.computed = 0
        b.preempted.append(Preemption(r.id, checkpoint, kv))
        b.touched.add(r.id)
        r.state = RequestState.PREEMPTED
        r.wait_since = now
        r.preemptions += 1
        self.preemptions += 1
        self._enqueue(r, now)

    def _compose(self, scores: Mapping[str, float], b: _StepBuilder, now: float) -> Plan:
        decode: list[str] = []
        prefilling: list[tuple[tuple, SchedRequest]] = []
        rank = self.policy.running_rank
        for r in self._running.values():
            if r.pending_prefill == 0:
                decode.append(r.id)
            else:
                prefilling.append((rank(r, scores), r))
        budget = self.config.step_tokens - len(decode)
        chunks: list[PrefillChunk] = []
        # Chunks go by rank, except that a prefill starved of budget for a
        # whole minimum quantum goes first: nothing admitted stalls forever
        # behind a stream of better-ranked prefills.
        mq = self.config.min_quantum_steps
        prefilling.sort(key=lambda item: (item[1].idle_steps < mq, item[0]))
        for _, r in prefilling:
            if budget <= 0:
                break
            pending = r.pending_prefill
            n = min(pending, budget)
            if n == pending - 1:
                # Never stop a prefill one token short: `computed == context - 1`
                # is what a decoding request looks like (pending_prefill 0), and a
                # resumed request (generated > 0) would be planned as decoding.
                n -= 1
                if n == 0:
                    continue
            chunks.append(PrefillChunk(r.id, r.computed, n, n == pending))
            budget -= n
        changed = bool(chunks or b.preempted or b.admitted)
        waiting = len(self._waiting) > 0
        return Plan(
            step=self._step,
            prefill=tuple(chunks),
            decode=tuple(decode),
            preempted=tuple(b.preempted),
            resumed=tuple(b.resumed),
            admitted=tuple(b.admitted),
            kv_tokens=self._kv_committed,
            swap_tokens=b.swap_tokens,
            stable_steps=1 if changed or not decode else self._stable_steps(len(decode), waiting),
            wakeup_at=self._waiting.next_change(now) if waiting else INF,
        )

    def _stable_steps(self, n_decode: int, waiting: bool) -> int:
        """Steps this decode-only plan can repeat before a decision is due:
        a request reaching max_tokens, KV pressure, and with work waiting a
        minimum quantum ending (a victim appears) or a quantum running out
        (time slicing)."""
        cfg = self.config
        steps = (cfg.kv_tokens - self._kv_committed) // n_decode + 1  # memory pressure
        mq, quanta = cfg.min_quantum_steps, cfg.quanta
        last = len(quanta)
        quantum_ends = waiting and self.policy.preemptive
        slicing = waiting and self.policy.time_slicing
        for r in self._running.values():
            left = r.max_tokens - r.generated
            if left < steps:
                steps = left
            if quantum_ends and r.run_steps < mq and mq - r.run_steps < steps:
                steps = mq - r.run_steps
            if slicing and r.level < last and quanta[r.level] - r.level_tokens < steps:
                steps = quanta[r.level] - r.level_tokens
        return max(1, steps)

    # ------------------------------------------------------------ postprocess
    def postprocess(self, plan: Plan, outcome: Outcome, now: float) -> StepResult:
        """Apply what the engine did; `now` is the time the step(s) ended.

        Returns the requests that finished (the engine's and those that
        reached max_tokens) and what each tenant consumed, as charged to the
        usage meter:
        each step's time apportioned by the tokens each request processed,
        and the KV each held times the time (at the midpoint of a repeated
        decode run, where it grew linearly).
        """
        steps = outcome.steps
        if steps < 1 or (steps > 1 and plan.prefill):
            raise ValueError("only decode-only plans may be repeated")
        elapsed = outcome.elapsed_s
        tokens_of = outcome.tokens_of
        # Tokens processed: a decode row yields one a step, or what the engine reports (a
        # remote engine may have run ahead several tokens between two steps).
        processed = sum(c.tokens for c in plan.prefill) + sum(tokens_of(rid) for rid in plan.decode)
        per_token = elapsed / processed if processed else 0.0
        quanta = self.config.quanta
        chunks = {c.request_id: c for c in plan.prefill}
        decoded = set(plan.decode)
        half = (steps - 1) / 2
        # tenant -> [gpu_s, kv_token_s, prefill, decode, reserved gpu used, reserved kv used]
        acc: dict[str, list[float]] = {}
        for r in self._running.values():
            a = acc.get(r.tenant)
            if a is None:
                a = acc[r.tenant] = [0.0, 0.0, 0, 0, 0.0, 0.0]
            rid = r.id
            chunk = None if rid in decoded else chunks.get(rid)
            if rid in decoded:
                n = tokens_of(rid)
                r.computed += n
                a[3] += n
                gpu = per_token * n
                held = r.computed - half
                self._produced(r, n, quanta)
            elif chunk is not None:
                r.computed += chunk.tokens
                a[2] += chunk.tokens
                gpu = per_token * chunk.tokens
                held = r.computed
                if chunk.produces_token:
                    self._produced(r, tokens_of(rid), quanta)
            else:
                gpu, held = 0.0, r.computed
            if gpu:
                r.run_steps += steps
                r.idle_steps = 0
            else:
                r.idle_steps += steps
            kv = held * elapsed
            a[0] += gpu
            a[1] += kv
            if r.res_gpu or r.res_kv:
                used_gpu = gpu if gpu < r.res_gpu else r.res_gpu
                used_kv = kv if kv < r.res_kv else r.res_kv
                r.res_gpu -= used_gpu
                r.res_kv -= used_kv
                a[4] += used_gpu
                a[5] += used_kv
        charges: dict[str, TenantCharge] = {}
        for tenant, a in acc.items():
            charges[tenant] = TenantCharge(a[0], a[1], int(a[2]), int(a[3]))
            if a[4] or a[5]:
                self.meter.release(tenant, a[4], a[5])
        finished = [rid for rid in outcome.finished if rid in self._running]
        finished += [r.id for r in self._running.values() if should_stop(r) and r.id not in
                     outcome.finished]
        for rid in finished:
            self._finish(rid)
        self._step += steps
        self.meter.charge(charges, elapsed, now, steps)
        return StepResult(charges, tuple(finished))

    def _produced(self, r: SchedRequest, n: int, quanta: tuple[int, ...]) -> None:
        r.generated += n
        self._kv_committed += n
        level = r.level
        if level >= len(quanta) or r.level_tokens + n < quanta[level]:
            r.level_tokens += n  # no demotion: the common case
            return
        r.level, r.level_tokens = demote(r.level, r.level_tokens, n, quanta)
        if r.level != level and r.remaining_tokens > 0 and r.res_gpu <= 0:
            # Demoted with its reservation used up: reserve its next quantum.
            _, decode = expected_work(r, quanta)
            gpu, kv = self.meter.reserve(r.tenant, r.context, 0, decode)
            r.res_gpu += gpu
            r.res_kv += kv

    def _finish(self, request_id: str) -> None:
        r = self._running.pop(request_id, None)
        if r is None:
            return
        self._release(r)
        self._running_bands[r.cls.band] -= 1
        self._kv_committed -= r.context
        self._mean_output += 0.02 * (r.generated - self._mean_output)
        r.state = RequestState.DONE
        del self._live[r.id]
        self._tenant_live[r.tenant] -= 1
