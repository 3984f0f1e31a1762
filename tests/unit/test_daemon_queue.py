"""The real Daemon on the in-memory queue store with the stand-in runner: no SQLite, no model.

Leases, fencing and step-failure attribution, driven step by step on a fake
clock (the daemon's one clock, which the engine shares here). Every run
ends equal to a reference: the same requests through a bare Engine.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from fsched.core.daemon.engine import Engine, StepFailed
from fsched.core.daemon.link import Wants
from fsched.core.daemon.loop import Daemon, DaemonConfig
from fsched.core.daemon.stepfaults import StepFaults
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.memory import MemoryQueueStore
from fsched.core.ports.records import JobSubmission, StorageError
from fsched.core.runners.standin import STANDIN_NAME, StandInRunner, standin_encode
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, RequestStatus, SamplingParams

from ..fakes import FakeClock

MAX_STEPS = 5_000  # a daemon still stepping after this many is stuck: the test stops it and fails


class OutOfMemoryError(RuntimeError):
    """What torch.cuda.OutOfMemoryError looks like to code that does not import torch."""


def job(n: int, seed: int, tenant: str = "alice",
        request_class: RequestClass = RequestClass.BATCH) -> JobSubmission:
    rng = random.Random(seed)
    lines = "".join(
        json.dumps({"custom_id": f"c{i}", "prompt": " ".join(f"w{rng.randrange(50)}" for _ in range(5)),
                    "max_tokens": rng.randint(4, 24), "seed": rng.randrange(1 << 40)}) + "\n"
        for i in range(n)
    )
    return JobSubmission(parse_job_file(lines.encode(), "job.jsonl"), tenant, request_class, 5, "job")


def plan_ids(plan: Plan) -> set[str]:
    return set(plan.decode) | {c.request_id for c in plan.prefill}


class Rig:
    """One daemon over a MemoryQueueStore (shared when given), recording every step's batch."""

    def __init__(self, store: MemoryQueueStore, clock: FakeClock, owner: str = "d1",
                 fail_when: Callable[[Plan], BaseException | None] | None = None, max_batch: int = 8,
                 exclusive: bool = True, lease_s: float = 10.0, heartbeat_s: float = 1.0):
        self.store, self.clock = store, clock
        self.batches: list[int] = []
        self.failures: list[int] = []  # the size of each failed step

        def step_fault(plan: Plan) -> BaseException | None:
            self.batches.append(len(plan_ids(plan)))
            if len(self.batches) > MAX_STEPS:
                self.daemon.stop()
            error = fail_when(plan) if fail_when else None
            if error is not None:
                self.failures.append(len(plan_ids(plan)))
            return error

        runner = StandInRunner(fail_when=step_fault)
        config = SchedulerConfig(max_batch=max_batch, kv_tokens=32_768, step_tokens=512)
        self.engine = Engine(runner, Scheduler(config, "fsched", store.tenant_weights()),
                             runner.context_length, clock=clock)
        self.daemon = Daemon(
            store, self.engine, lambda c: standin_encode(c.prompt_text, c.messages),
            DaemonConfig(owner=owner, host="test", pid=0, device="standin", model=STANDIN_NAME,
                         policy="fsched", until_idle=True,
                         exclusive=exclusive, lease_s=lease_s, heartbeat_s=heartbeat_s,
                         sync_interval_s=0.01, idle_sleep_s=0.05),
            clock=clock, sleep=clock.advance,
        )

    def run(self) -> None:
        self.daemon.run()
        assert not self.daemon.stopping, f"still stepping after {MAX_STEPS} steps: {self.failures}"


def reference(store: MemoryQueueStore) -> dict[str, list[int]]:
    """Every request's tokens through a bare engine: no store, no daemon, no faults."""
    runner = StandInRunner()
    config = SchedulerConfig(max_batch=64, kv_tokens=32_768, step_tokens=512)
    engine = Engine(runner, Scheduler(config, "fcfs"), runner.context_length)
    requests = [Request.to_run(r.id, standin_encode(r.prompt, r.messages), SamplingParams.from_json(r.params))
                for r in store.requests()]
    return {rid: result.tokens for rid, result in engine.run_all(requests).items()}


def outputs(store: MemoryQueueStore) -> dict[str, list[int]]:
    return {r.id: r.output_tokens for r in store.requests()}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(tick=0.001)


class RecordingStore(MemoryQueueStore):
    """Keeps the request id of every write it is asked for, applied or refused."""

    def __init__(self, clock: FakeClock):
        super().__init__(clock)
        self.writes: list[str] = []

    def flush_tokens(self, owner, updates):
        self.writes += [u.request_id for u in updates]
        return super().flush_tokens(owner, updates)

    def finish_requests(self, completions, owner=None):
        self.writes += [c.request_id for c in completions]
        return super().finish_requests(completions, owner)


@pytest.fixture
def store(clock) -> RecordingStore:
    return RecordingStore(clock)


def test_a_plain_run_ends_every_request_with_the_reference_output(store, clock):
    store.submit([job(12, seed=1), job(5, seed=2, tenant="bob", request_class=RequestClass.REALTIME)])
    rig = Rig(store, clock)
    rig.run()
    assert {r.status.succeeded for r in store.requests()} == {True}
    assert outputs(store) == reference(store)
    assert all(r.attempts == 1 and r.first_token_at is not None for r in store.requests())
    assert rig.daemon.fenced_writes == 0 and store.refused == 0
    goodbye = store.daemons["d1"]
    assert goodbye.stopped_at is not None and goodbye.stats.steps == rig.daemon.figures.steps > 0


def test_a_heartbeat_publishes_the_kv_the_runner_holds_when_it_is_made(store, clock):
    beats: list[tuple[int, int, int]] = []  # (published, the runner's then, running)
    rigs: list[Rig] = []
    heartbeat = store.heartbeat

    def recorded(summary):
        beats.append((summary.stats.kv_tokens, rigs[0].engine.runner.kv_tokens, summary.stats.running))
        return heartbeat(summary)

    store.heartbeat = recorded
    store.submit([job(12, seed=1), job(5, seed=2, tenant="bob")])
    rigs.append(Rig(store, clock, heartbeat_s=0.005))
    rigs[0].run()
    assert all(published == held for published, held, _ in beats)
    assert any(published > 0 for published, _, running in beats if running)
    assert beats[-1][0] == 0  # the goodbye: nothing held


def test_a_request_whose_lease_was_taken_is_dropped_without_writing(store, clock):
    store.submit([job(4, seed=3)])
    rig = Rig(store, clock, exclusive=False, lease_s=3.0)
    rig.daemon.sync()
    assert len(rig.daemon.held) == 4
    rig.daemon.turn()
    rig.daemon.turn()
    at_takeover = outputs(store)
    clock.advance(10)  # the daemon stalled past its lease
    assert store.reclaim_expired() == 4
    assert len(store.claim("d2", per_group=10)) == 4  # another daemon took them over
    store.writes.clear()
    rig.daemon.renew()
    assert rig.daemon.lost_leases == 4 and len(rig.daemon.held) == 0 and not rig.engine.has_work
    rig.daemon.shutdown()
    assert store.writes == []  # nothing even attempted for a lost request
    assert store.refused == 0 and outputs(store) == at_takeover
    assert {(r.status, r.lease_owner, r.lease_epoch) for r in store.requests()} == {
        (RequestStatus.RUNNING, "d2", 2)}


def test_writes_under_a_stale_lease_are_refused_and_counted(store, clock):
    store.submit([job(4, seed=4, request_class=RequestClass.REALTIME)])  # realtime: flushed every step
    rig = Rig(store, clock, exclusive=False, lease_s=250.0, heartbeat_s=100.0)
    rig.daemon.sync()
    rig.daemon.turn()
    clock.advance(260)  # the lease runs out before this daemon's next renewal
    store.reclaim_expired()
    store.claim("d2", per_group=10)
    at_takeover = outputs(store)
    rig.daemon._last_beat = clock.now  # the renewal is not due: the daemon writes before it learns
    for _ in range(200):
        if not rig.engine.has_work:
            break
        rig.daemon.turn()
    assert not rig.engine.has_work  # it ran its requests to the end, and every write bounced
    assert rig.daemon.fenced_writes == store.refused > 4  # token flushes and the four completions
    assert outputs(store) == at_takeover
    assert {(r.status, r.lease_owner) for r in store.requests()} == {(RequestStatus.RUNNING, "d2")}


def test_a_failed_step_with_one_request_counts_against_it(store, clock, caplog):
    """A poison request fails after max_attempts steps alone; the requests that shared its steps
    finish with the reference output; the batch is halved until the poison runs alone."""
    store.submit([job(12, seed=5)])
    poison = "7"
    rig = Rig(store, clock, fail_when=lambda plan: RuntimeError("bad input") if poison in plan_ids(plan)
              else None)
    with caplog.at_level(logging.WARNING, logger="fsched.daemon"):
        rig.run()
    bad = store.request(poison)
    assert bad.status is RequestStatus.FINISHED_FAILED and "3 times with this request alone" in bad.error
    want = reference(store)
    assert {r.id: r.output_tokens for r in store.requests() if r.id != poison} == {
        rid: tokens for rid, tokens in want.items() if rid != poison}
    assert rig.failures[-3:] == [1, 1, 1]
    assert len(rig.failures) <= 3 + (8).bit_length()  # bounded: log2(batch) halvings, then 3 alone
    assert rig.daemon.faults.failures == {}


def test_a_failed_step_with_several_counts_against_none_and_caps_the_batch(store, clock):
    store.submit([job(12, seed=6)])
    seen: list[set[str]] = []

    def once(plan: Plan):
        seen.append(plan_ids(plan))
        return RuntimeError("transient device error") if len(seen) == 3 else None

    rig = Rig(store, clock, fail_when=once)
    rig.run()
    involved = seen[2]
    assert len(involved) > 1 and rig.failures == [len(involved)]
    assert {r.status.succeeded for r in store.requests()} == {True}
    assert outputs(store) == reference(store)  # recomputed identically
    assert {store.request(rid).attempts for rid in involved} == {2}  # claimed again, nothing failed
    assert rig.daemon.faults.failures == {}  # counted against none
    assert max(rig.batches[3:]) <= len(involved) // 2  # capped while the rest ran


@pytest.mark.parametrize("error", [OutOfMemoryError("CUDA out of memory"), MemoryError()],
                         ids=["cuda-oom", "host-oom"])
def test_out_of_memory_halves_the_batch_for_good(store, clock, error):
    store.submit([job(12, seed=7)])
    rig = Rig(store, clock, fail_when=lambda plan: error if len(plan_ids(plan)) > 3 else None)
    rig.run()
    assert rig.engine.max_batch == 2 and len(rig.failures) == 2  # 8 -> 4 -> 2
    assert {r.status.succeeded for r in store.requests()} == {True}
    assert outputs(store) == reference(store)


def test_a_dead_daemons_requests_are_reclaimed_after_their_lease_and_finished(store, clock):
    store.submit([job(10, seed=8)])
    dead = Rig(store, clock, owner="dead", exclusive=False, lease_s=3.0)
    dead.daemon.sync()
    dead.daemon.sync()  # one batch, then the rest
    dead.daemon.turn()  # it took everything, runs a step, flushes, and dies (no goodbye)
    live = Rig(store, clock, owner="live", exclusive=False, lease_s=3.0)
    live.run()  # idle until the leases expire; its sweep requeues them; it claims and finishes them
    assert {r.status.succeeded for r in store.requests()} == {True}
    assert outputs(store) == reference(store)
    assert {(r.attempts, r.lease_epoch) for r in store.requests()} == {(2, 2)}
    assert live.daemon.fenced_writes == 0 and clock.now > 3.0 + 1_000.0


def test_a_cancelled_job_stops_at_the_next_sync_with_its_output_so_far(store, clock):
    (submitted,) = store.submit([job(4, seed=9)])
    rig = Rig(store, clock)
    rig.daemon.sync()
    rig.daemon.turn()
    rig.daemon.flush(everything=True)
    store.cancel_job(submitted.job_id)
    rig.daemon.sync()
    assert len(rig.daemon.held) == 0 and not rig.engine.has_work
    assert {r.status for r in store.requests()} == {RequestStatus.FINISHED_CANCELLED}
    assert all(len(r.output_tokens) == 1 for r in store.requests())


class FakeEngine:
    """What StepFaults steers: the batch limit and the temporary cap."""

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self.caps: list[tuple[int, int]] = []

    def shrink_batch(self, failed_batch: int) -> tuple[int, int]:
        before, self.max_batch = self.max_batch, max(1, min(self.max_batch, failed_batch) // 2)
        return before, self.max_batch

    def cap_batch(self, rows: int, steps: int) -> None:
        self.caps.append((rows, steps))


def test_step_fault_attribution_rule():
    engine = FakeEngine(8)
    faults = StepFaults(engine, max_attempts=2)
    several = faults.judge(StepFailed(["1", "2", "3", "4"], RuntimeError("x")), ["1", "2", "3", "4", "5"])
    assert several.fail == {} and several.requeue == ["1", "2", "3", "4", "5"] and faults.failures == {}
    assert engine.caps == [(2, 200)] and engine.max_batch == 8
    alone = faults.judge(StepFailed(["3"], RuntimeError("x")), ["3", "5"])
    assert (alone.fail, alone.requeue, faults.failures) == ({}, ["3", "5"], {"3": 1})
    again = faults.judge(StepFailed(["3"], RuntimeError("x")), ["3"])
    assert (again.fail, again.requeue, faults.failures) == ({"3": 2}, [], {})
    oom = faults.judge(StepFailed(["1", "2", "3", "4", "5", "6"], MemoryError()), ["1"])
    assert oom.requeue == ["1"] and engine.max_batch == 3 and len(engine.caps) == 1


def test_holding_nothing_a_daemon_claims_one_batch_a_group_then_tops_up_to_its_held_batches(store, clock):
    store.submit([job(30, seed=1), job(30, seed=2, tenant="bob")])
    rig = Rig(store, clock, max_batch=4)
    rig.daemon.sync()  # the first claim: one batch per group, so the engine starts sooner
    assert rig.daemon.held.per_group() == {("alice", RequestClass.BATCH): 4, ("bob", RequestClass.BATCH): 4}
    rig.daemon.sync()  # then held_batches (2) batches per group
    assert rig.daemon.held.per_group() == {("alice", RequestClass.BATCH): 8, ("bob", RequestClass.BATCH): 8}


class AnnouncingLink:
    """A link that a server announces new work on while the daemon's step runs (no sockets)."""

    address = "test:0"
    wake_fd = -1  # the stand-in runner waits on nothing

    def __init__(self) -> None:
        self.wants = Wants()

    def take_wake(self) -> Wants:
        wants, self.wants = self.wants, Wants()
        return wants

    def asked(self) -> bool:
        return bool(self.wants)

    def wait(self, timeout: float) -> None:
        pass

    def watcher(self, job_id: int) -> None:
        return None

    def send(self, lines) -> None:
        pass

    def close(self) -> None:
        pass


def test_work_announced_during_a_step_is_claimed_when_the_step_ends_not_a_pass_later(store, clock):
    store.submit([job(4, seed=1)])
    link = AnnouncingLink()

    announced = []

    def announce(plan: Plan) -> None:  # a realtime request arrives while the batch's step runs
        if not announced:
            announced.append(store.submit([job(1, seed=2, tenant="bob",
                                               request_class=RequestClass.REALTIME)]))
            link.wants.claim = True

    rig = Rig(store, clock, max_batch=4, fail_when=announce)
    rig.daemon = Daemon(store, rig.engine, rig.daemon.encode, rig.daemon.config, clock=clock,
                        sleep=clock.advance, link=link)
    rig.daemon.claim()
    assert rig.daemon.held.per_group() == {("alice", RequestClass.BATCH): 4}
    rig.daemon.step()  # one pass: the batch's step, during which bob's request is announced
    assert rig.daemon.held.per_group() == {("alice", RequestClass.BATCH): 4,
                                           ("bob", RequestClass.REALTIME): 1}



class OrderedStore(RecordingStore):
    """Records token writes (when, whose) in one list with the steps (`events`), in their order."""

    def __init__(self, clock: FakeClock):
        super().__init__(clock)
        self.events: list[tuple[str, float, frozenset]] = []

    def flush_tokens(self, owner, updates):
        self.events.append(("write", self.clock.now, frozenset(u.request_id for u in updates)))
        return super().flush_tokens(owner, updates)


def _announcing_rig(store: OrderedStore, clock: FakeClock, link: AnnouncingLink,
                    arrivals: Callable[[int], bool]) -> Rig:
    """A daemon on a batch of alice's, with bob's realtime requests announced during the steps
    `arrivals` picks (by step number); each step takes 30 ms, so the batch flush (every 100 ms)
    falls due every few steps."""
    steps = []

    def step(plan: Plan) -> None:
        steps.append(plan)
        store.events.append(("step", clock.now, frozenset(plan_ids(plan))))
        clock.advance(0.03)
        if arrivals(len(steps)):
            store.submit([job(1, seed=len(steps), tenant="bob", request_class=RequestClass.REALTIME)])
            link.wants.claim = True

    lines = "".join(json.dumps({"custom_id": f"c{i}", "prompt": f"w{i}", "max_tokens": 500}) + "\n"
                    for i in range(4))
    store.submit([JobSubmission(parse_job_file(lines.encode(), "job.jsonl"), "alice", RequestClass.BATCH, 5,
                                "job")])
    rig = Rig(store, clock, max_batch=8, fail_when=step)
    rig.daemon = Daemon(store, rig.engine, rig.daemon.encode, replace(rig.daemon.config, batch_flush_s=0.1),
                        clock=clock, sleep=clock.advance, link=link)
    rig.daemon.claim()
    return rig


def _ids(store: OrderedStore, tenant: str) -> set[str]:
    """The requests of alice's batch (the first job), or of bob's realtime jobs (the others)."""
    first = min(r.job_id for r in store.requests())
    return {r.id for r in store.requests() if (r.job_id == first) == (tenant == "alice")}


def test_the_step_that_starts_announced_latency_work_goes_before_the_batch_flush():
    """The turn that claims a realtime request leaves the batch's token flush to after the step that
    takes the request to the engine (the flush held that step back by tens of milliseconds)."""
    clock = FakeClock(tick=0.001)
    store, link = OrderedStore(clock), AnnouncingLink()
    rig = _announcing_rig(store, clock, link, lambda n: n == 10)
    for _ in range(14):
        rig.daemon.step()
    bob, alice = _ids(store, "bob"), _ids(store, "alice")
    assert bob
    steps = [i for i, (kind, _, ids) in enumerate(store.events) if kind == "step"]
    after = store.events[steps[9] + 1:]  # what followed the step during which bob's request came
    started = next(i for i, (kind, _, ids) in enumerate(after) if kind == "step" and ids & bob)
    batch_writes = [i for i, (kind, _, ids) in enumerate(after) if kind == "write" and ids & alice]
    assert batch_writes, "the batch's tokens were written meanwhile"
    assert started < batch_writes[0], after


def test_latency_work_arriving_every_step_puts_the_batch_flush_off_for_a_sync_interval_at_most():
    """However often latency work comes, the batch's tokens are still written about every flush
    interval: the flush waits a sync interval (10 ms here, less than a step) at most."""
    clock = FakeClock(tick=0.001)
    store, link = OrderedStore(clock), AnnouncingLink()
    rig = _announcing_rig(store, clock, link, lambda n: True)
    for _ in range(40):
        rig.daemon.step()
    alice = _ids(store, "alice")
    written = [at for kind, at, ids in store.events if kind == "write" and ids & alice]
    assert len(written) >= 4
    assert max(b - a for a, b in zip(written, written[1:], strict=False)) <= 0.1 + 2 * 0.03 + 0.02


class ClaimsInOrderStore(OrderedStore):
    """Records each claim (when, which requests) among the steps and writes."""

    def claim(self, *args, **kw):
        claimed = super().claim(*args, **kw)
        self.events.append(("claim", self.clock.now, frozenset(r.id for r in claimed)))
        return claimed


class WatchingLink(AnnouncingLink):
    """A server that watches every job: each step's tokens are pushed to it (recorded as `push`)."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events

    def watcher(self, job_id: int) -> str:
        return "server"

    def send(self, lines) -> None:
        if lines:
            self.events.append(("push", None, frozenset()))


def test_a_steps_tokens_are_pushed_before_the_work_announced_during_it_is_claimed():
    """The tokens a step brought (first tokens among them) go to the servers at once; the claim of
    what was announced meanwhile, a transaction, follows (it held them back by its length)."""
    clock = FakeClock(tick=0.001)
    store = ClaimsInOrderStore(clock)
    link = WatchingLink(store.events)
    rig = _announcing_rig(store, clock, link, lambda n: n == 3)
    for _ in range(5):
        rig.daemon.step()
    steps = [i for i, (kind, _, _) in enumerate(store.events) if kind == "step"]
    after = [kind for kind, _, ids in store.events[steps[2] + 1:steps[3]] if kind != "claim" or ids]
    assert after[:2] == ["push", "claim"], after


class WatchedStore(RecordingStore):
    """A table whose cheap change check the test sets (`changed`, taken by the check), counting the
    sync's reads of the weights; `fail_weights` of them fail as a locked table does."""

    def __init__(self, clock: FakeClock):
        super().__init__(clock)
        self.changed = True
        self.weight_reads = self.fail_weights = self.checks = 0

    def may_have_changed(self) -> bool:
        self.checks += 1
        changed, self.changed = self.changed, False
        return changed

    def tenant_weights(self):
        self.weight_reads += 1
        if self.fail_weights:
            self.fail_weights -= 1
            raise StorageError("database is locked")
        return super().tenant_weights()


def _busy_rig(clock: FakeClock) -> tuple[WatchedStore, int, Rig]:
    store = WatchedStore(clock)
    (submitted,) = store.submit([job(4, seed=9)])
    rig = Rig(store, clock)
    rig.daemon.start()
    rig.daemon.step()  # idle, the table changed: the sync claims the job's requests, then a step
    assert len(rig.daemon.held) == 4
    store.weight_reads = 0
    return store, submitted.job_id, rig


def test_a_busy_daemon_makes_no_due_sync_while_the_table_is_unchanged_and_one_once_it_changed(clock):
    store, job_id, rig = _busy_rig(clock)
    for _ in range(3):
        clock.advance(1.0)  # a sync is due at every pass
        rig.daemon.step()
    assert store.weight_reads == 0 and len(rig.daemon.held) > 0  # no sync: nothing new to find
    store.cancel_job(job_id)
    store.changed = True
    clock.advance(1.0)
    rig.daemon.step()
    assert store.weight_reads == 1 and len(rig.daemon.held) == 0  # the cancel seen at the due sync
    assert {r.status for r in store.requests()} == {RequestStatus.FINISHED_CANCELLED}


def test_a_change_seen_stays_unsynced_until_a_sync_is_in(clock):
    store, job_id, rig = _busy_rig(clock)
    store.cancel_job(job_id)
    store.changed, store.fail_weights = True, 1
    clock.advance(1.0)
    rig.daemon.step()  # the sync fails: the table is locked
    assert store.weight_reads == 1 and len(rig.daemon.held) > 0
    clock.advance(1.0)
    rig.daemon.step()  # the check says nothing new since, but the change seen is not synced yet
    assert store.weight_reads == 2 and len(rig.daemon.held) == 0


def test_a_due_check_that_finds_the_table_unchanged_is_made_once_an_interval_not_every_pass():
    clock = FakeClock()  # time moves only as the test says
    store, job_id, rig = _busy_rig(clock)
    clock.advance(1.0)
    store.checks = 0
    interval = rig.daemon.config.sync_interval_s
    for _ in range(4):  # passes closer together than the sync interval
        rig.daemon.step()
        clock.advance(interval / 5)
    assert store.checks == 1 and store.weight_reads == 0  # one look, nothing new: no sync either
    store.cancel_job(job_id)
    store.changed = True
    clock.advance(interval)
    rig.daemon.step()  # an interval after that look: the next, which sees the cancel
    assert store.checks == 2 and store.weight_reads == 1 and len(rig.daemon.held) == 0
