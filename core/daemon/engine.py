"""The engine loop: the scheduler decides, the runner executes, the scheduler learns.

    plan = scheduler.schedule(now)
    result = runner.run(plan)
    scheduler.postprocess(plan, result.outcome, now)

No torch here: the runner is passed in (any `Runner`: the model runner, the
stand-in, a remote engine), so the loop is the same over each of them.
`Engine.run_all` drives it standalone over a list of requests (tests and
benchmarks); the daemon drives `step()` itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace

from fsched.core.runners.protocol import Preparing, Redrawing, RequestRefused, Runner, Wakeable
from fsched.core.sched.accounting import WorkTally
from fsched.core.sched.attainment import FirstTokenTally
from fsched.core.sched.explain import RequestStanding, explain
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.sched.usage import TenantCharge, peer_totals
from fsched.core.types import RequestId, RequestStatus, SamplingParams, TokenLogprobs


@dataclass(slots=True)
class EngineResult:
    """A request's output as it ended, read from its record (its text through the runner)."""

    id: RequestId
    tokens: list[int]
    text: str
    status: RequestStatus  # a finished one: why it finished
    prompt_tokens: int
    error: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked for


@dataclass(slots=True)
class StepReport:
    tokens: dict[RequestId, int]  # request -> the token it produced this step
    finished: list[EngineResult]
    elapsed_s: float
    batch_size: int
    charges: Mapping[str, TenantCharge] = field(default_factory=dict)  # what each tenant consumed
    produced: int = 0  # tokens produced: one per entry of `tokens`, more where a remote engine ran ahead
    at: float | None = None  # the step's end on the engine's clock: its first tokens' time


@dataclass(slots=True, frozen=True)
class EngineSnapshot:
    running: int
    waiting: int
    kv_budget: int  # KV cache budget in tokens
    kv_tokens: int  # KV cache in use now (read when asked: a sum over the open requests, not kept a step)
    preemptions: int  # since the engine started
    requests: list[RequestStanding]  # running ones first, then waiting in admission order
    first_tokens: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # FirstTokenTally.to_json
    work: WorkTally = field(default_factory=WorkTally)  # tokens computed, recomputed or parked


# An engine whose only requests wait on their grammar's compile waits this long for one, then steps
# again (its loop's heartbeat goes on meanwhile).
PREPARE_WAIT_S = 0.02


@dataclass(slots=True, frozen=True)
class _Preparing:
    """A request waiting on the runner's preparation (its grammar's compile) before it is added."""

    request: Request
    future: Future
    arrival: float
    waiting_since: float  # since when its first token is awaited (its time in the table included)


class StepFailed(Exception):
    """The model step raised; `request_ids` were in it. The engine has dropped them all."""

    def __init__(self, request_ids: list[RequestId], error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.request_ids = request_ids
        self.error = error


class ContextOverflow(ValueError):
    """A request that cannot fit the model's context; it fails alone, with this message."""


def fit_to_context(prompt_tokens: int, generated: int, params: SamplingParams, context_length: int) -> int:
    """The max_tokens a request runs with, or ContextOverflow.

    As vLLM and OpenAI do: a prompt plus an asked-for max_tokens over the
    context is refused (asking for more than can be generated is an error,
    not a silent cut). A max_tokens that only a default filled in is capped
    at the room the prompt leaves, so a request that named none still runs.
    """
    if prompt_tokens + generated >= context_length:
        raise ContextOverflow(
            f"the prompt is {prompt_tokens} tokens; the model's context holds {context_length}"
        )
    room = context_length - prompt_tokens
    if params.max_tokens <= room:
        return params.max_tokens
    if params.max_tokens_is_default:
        return room
    raise ContextOverflow(
        f"the prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_tokens}) is "
        f"{prompt_tokens + params.max_tokens} tokens, over the model's context of {context_length}; "
        f"lower max_tokens to at most {room} or shorten the prompt"
    )


class Engine:
    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        context_length: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.runner = runner
        # A runtime-checkable protocol's isinstance walks the runner's attributes each call: asked
        # once here, not per request and per step.
        self._prepares = isinstance(runner, Preparing)
        self._redraws = isinstance(runner, Redrawing)
        self.waits = isinstance(runner, Wakeable)  # its steps wait for an engine's output (remote)
        self.scheduler = scheduler
        self.context_length = context_length
        self.clock = clock
        self._requests: dict[RequestId, Request] = {}  # the live records it runs (the scheduler's too)
        self._preparing: dict[RequestId, _Preparing] = {}
        self.first_tokens = FirstTokenTally()
        self.steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.scheduler.running) or self.scheduler.waiting_count > 0 or bool(self._preparing)

    @property
    def has_waiters(self) -> bool:
        """Whether requests wait to be admitted (the scheduler's queue, or their preparation)."""
        return self.scheduler.waiting_count > 0 or bool(self._preparing)

    def wake_on(self, fd: int) -> None:
        """Where the runner's step may wait on its engine, a readable `fd` ends the wait."""
        if self.waits:
            self.runner.wake_on(fd)

    def add(self, request: Request, queued_s: float = 0.0) -> EngineResult | None:
        """Queue a request (its record, from now on the scheduler's and this engine's to update); a
        request that can never run fails alone, at once. One whose grammar is still compiling waits
        apart (off the step loop) and joins the queue once it is compiled. `queued_s`: how long it
        waited in the table before, counted in its first token's wait."""
        now = self.clock()
        since = now - max(0.0, queued_s)
        future = self.runner.prepare(request.params) if self._prepares else None
        if future is not None and not future.done():
            self._preparing[request.id] = _Preparing(request, future, now, since)
            return None
        return self._admit(request, future, now, since)

    def _admit(self, request: Request, prepared: Future | None, now: float, since: float
               ) -> EngineResult | None:
        if prepared is not None and prepared.exception() is not None:
            return self._failed(request, f"response_format: {prepared.exception()}")
        request.arrival = now
        try:
            request.max_tokens = fit_to_context(
                len(request.prompt), len(request.output), request.params, self.context_length
            )
        except ContextOverflow as exc:
            return self._failed(request, str(exc))
        try:
            self.scheduler.add(request)
        except ValueError as exc:
            return self._failed(request, str(exc))
        try:
            self.runner.add(request)
        except RequestRefused as exc:
            self.scheduler.cancel(request.id)
            return self._failed(request, str(exc))
        self._requests[request.id] = request
        request.queued_from = since
        return None

    def cancel(self, request_id: RequestId) -> bool:
        if self._preparing.pop(request_id, None) is not None:
            return True
        if request_id not in self._requests:
            return False
        self.scheduler.cancel(request_id)
        self.runner.release(request_id)
        self._requests.pop(request_id, None)
        return True

    def step(self, wait_s: float | None = None, decide_s: float | None = None) -> StepReport | None:
        """One engine step; None when there was nothing to run. `wait_s`: how long the runner may wait
        for its engine's output (where it waits: a remote engine), instead of its own bound; at most
        `decide_s` while requests still wait after the plan (the scheduler's decisions for them depend
        on the clock, and the next step takes them)."""
        refused = self._admit_prepared()
        plan = self.scheduler.schedule(self.clock())
        if plan.empty:
            if not refused and self._preparing:
                wait([p.future for p in self._preparing.values()], PREPARE_WAIT_S, FIRST_COMPLETED)
            return StepReport({}, refused, 0.0, 0) if refused else None
        if wait_s is not None and self.waits:
            self.runner.wait_at_most(min(wait_s, decide_s) if decide_s is not None and self.has_waiters
                                     else wait_s)
        try:
            result = self.runner.run(plan)
        except Exception as exc:
            # The runner's state is not to be trusted after a failed step:
            # drop every request; the caller requeues or fails them.
            involved = sorted(set(plan.decode) | {c.request_id for c in plan.prefill})
            for rid in list(self._requests):
                self.cancel(rid)
            raise StepFailed(involved, exc) from exc
        now = self.clock()
        for rid, check in result.finished.items():  # why the runner stopped them: the scheduler keeps it
            if rid in self._requests:
                self._requests[rid].status = check.finished
        post = self.scheduler.postprocess(plan, result.outcome, now)
        self.steps += 1
        requests = self._requests
        for rid in result.tokens:
            if (request := requests.get(rid)) is not None and request.first_token_at is None:
                self._count_first_token(request, now)
        finished = refused
        finished += [self._finish(rid, check.finished) for rid, check in result.finished.items()]
        # A remote engine can refuse one request (its own error answer): it fails alone.
        for rid, error in result.failed.items():
            if rid in self._requests:
                finished.append(self._refused(rid, error))
        # The scheduler also ends a request at max_tokens on its own count.
        finished += [self._finish(rid, RequestStatus.FINISHED_LENGTH) for rid in post.finished
                     if rid not in result.finished and rid in self._requests]
        return StepReport(
            tokens=result.tokens,
            finished=finished,
            elapsed_s=result.outcome.elapsed_s,
            batch_size=len(plan.decode) + len(plan.prefill),
            charges=post.charges,
            produced=result.outcome.tokens_of_all(result.tokens),
            at=now,
        )

    def _admit_prepared(self) -> list[EngineResult]:
        """Queue the requests whose preparation ended; those it refused, failed."""
        refused = []
        for rid in [rid for rid, p in self._preparing.items() if p.future.done()]:
            p = self._preparing.pop(rid)
            failed = self._admit(p.request, p.future, p.arrival, p.waiting_since)
            if failed is not None:
                refused.append(failed)
        return refused

    @property
    def request_ids(self) -> list[RequestId]:
        return [*self._requests, *self._preparing]

    # -- what the daemon steers and reads, without reaching into the scheduler -----------

    def set_weight(self, tenant: str, weight: float) -> None:
        """A tenant's new weight, from the next step on."""
        self.scheduler.set_weight(tenant, weight)

    @property
    def max_batch(self) -> int:
        """The running batch's limit as it is now (an out-of-memory shrink lowers it)."""
        return self.scheduler.config.max_batch

    def shrink_batch(self, failed_batch: int) -> tuple[int, int]:
        """Halve the batch after a step of `failed_batch` requests ran out of memory, for good
        (floor 1); return the limit before and after."""
        before = self.scheduler.config.max_batch
        after = max(1, min(before, failed_batch) // 2)
        if after < before:
            self.scheduler.limit_batch(after)
        return before, after

    def cap_batch(self, rows: int, steps: int) -> None:
        """At most `rows` running requests for the next `steps` steps, then the limit again."""
        self.scheduler.cap_batch(rows, steps)

    def local_usage(self) -> dict[str, tuple[float, float]]:
        """This engine's decayed usage per tenant (GPU s, KV token-s), as of now."""
        return self.scheduler.meter.local_usage(self.clock())

    def set_peer_usage(self, peers: Iterable[tuple[str, float, float, float]]) -> None:
        """Other engines' published usage, (tenant, gpu_s, kv_token_s, age_s) rows, decayed by age."""
        now = self.clock()
        totals = peer_totals(peers, self.scheduler.config.usage_half_life_s)
        self.scheduler.meter.set_peer_usage(totals, now)

    def snapshot(self) -> EngineSnapshot:
        """What the engine holds and why each request runs or waits: for a status view."""
        return EngineSnapshot(
            running=len(self.scheduler.running),
            waiting=self.scheduler.waiting_count,
            kv_budget=self.scheduler.config.kv_tokens,
            kv_tokens=self.runner.kv_tokens,
            preemptions=self.scheduler.preemptions,
            requests=explain(self.scheduler, self.clock()),
            first_tokens=self.first_tokens.to_json(),
            work=replace(self.scheduler.work),
        )

    def text(self, request: Request) -> str:
        """A request's output text so far (its tokens and logprobs are on the record)."""
        return self.runner.text(request)

    def redraws(self, request: Request) -> bool:
        """Whether tokens the request produced could come out otherwise after a crash (then they are
        written before they are shown); the built-in engine's draws depend on seed and position only."""
        return self._redraws and self.runner.redraws(request)

    def run_all(
        self, requests: Iterable[Request], on_step: Callable[[StepReport], None] | None = None
    ) -> dict[RequestId, EngineResult]:
        """Run requests to completion; results by id."""
        results: dict[RequestId, EngineResult] = {}
        for request in requests:
            failed = self.add(request)
            if failed is not None:
                results[failed.id] = failed
        while self.has_work:
            report = self.step()
            if report is None:
                continue
            if on_step is not None:
                on_step(report)
            for r in report.finished:
                results[r.id] = r
        return results

    def _finish(self, rid: RequestId, status: RequestStatus) -> EngineResult:
        request = self._requests[rid]
        request.status = status
        result = EngineResult(
            id=rid,
            tokens=list(request.output),
            text=self.runner.text(request),
            status=status,
            prompt_tokens=len(request.prompt),
            logprobs=list(request.output_logprobs),
        )
        self.runner.release(rid)
        self._requests.pop(rid, None)
        return result

    def _refused(self, rid: RequestId, error: str) -> EngineResult:
        """A request the runner reports failed: out of the scheduler, out of the runner, failed."""
        self.scheduler.cancel(rid)  # while its status still says where the scheduler holds it
        self.runner.release(rid)
        return self._failed(self._requests.pop(rid), error)

    def _failed(self, request: Request, error: str) -> EngineResult:
        request.status = RequestStatus.FINISHED_FAILED
        return EngineResult(
            id=request.id,
            tokens=list(request.output),
            text="",
            status=RequestStatus.FINISHED_FAILED,
            prompt_tokens=len(request.prompt),
            error=error,
        )

    def _count_first_token(self, request: Request, now: float) -> None:
        """Stamp a request's first token (it has none yet); count its wait, unless it came before a
        restart."""
        request.first_token_at = now
        if not request.resumed_tokens:
            target = self.scheduler.config.target_s(request.request_class)
            self.first_tokens.record(request.tenant, request.request_class, now - request.queued_from,
                                     target)
