"""The daemon writes a step back in one store transaction: the step's completions, the latency classes'
tokens and the claim of work announced during the step; one the table fails loses and repeats nothing."""

from __future__ import annotations

from fsched.core.daemon.loop import Daemon
from fsched.core.ports.memory import MemoryQueueStore
from fsched.core.ports.records import StorageError
from fsched.core.sched.plan import Plan
from fsched.core.types import RequestClass

from ..fakes import FakeClock
from .test_daemon_queue import AnnouncingLink, Rig, job, outputs, reference

WRITES = ("claim", "flush_tokens", "finish_requests", "write_step")


class TransactionStore(MemoryQueueStore):
    """Records each write transaction a caller asks for (a call of one of `WRITES`, not the calls one
    makes of the others) as what it carried: tokens, completions, a claim; `fail_when` may refuse one."""

    def __init__(self, clock: FakeClock, fail_when=None):
        super().__init__(clock)
        self.events: list[tuple[str, ...]] = []
        self.fail_when = fail_when or (lambda carried: False)
        self._depth = 0

    def __getattribute__(self, name):
        method = super().__getattribute__(name)
        if name not in WRITES:
            return method

        def recorded(*args, **kwargs):
            if self._depth == 0:
                carried = _carried(name, args, kwargs)
                if self.fail_when(carried):
                    raise StorageError("the table failed this transaction")
                self.events.append(("write", *carried))
            self._depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._depth -= 1
        return recorded


def _carried(name: str, args: tuple, kwargs: dict) -> tuple[str, ...]:
    if name == "claim":
        return ("claim",)
    if name == "flush_tokens":
        return ("tokens",) if args[1] else ()
    if name == "finish_requests":
        return ("completions",) if args[0] else ()
    owner, updates, completions, *rest = args
    claim = rest[0] if rest else kwargs.get("claim")
    return tuple(kind for kind, there in (("tokens", updates), ("completions", completions),
                                          ("claim", claim)) if there)


def _realtime_rig(store: TransactionStore, clock: FakeClock) -> Rig:
    """bob's realtime requests (table only: their tokens are written every step) and, announced during
    each of the first steps, one more of carol's."""
    store.submit([job(6, seed=1, tenant="bob", request_class=RequestClass.REALTIME)])
    link = AnnouncingLink()
    arrivals = []

    def announce(plan: Plan) -> None:
        store.events.append(("step",))
        if len(arrivals) < 30:
            arrivals.append(store.submit([job(1, seed=len(arrivals), tenant="carol",
                                              request_class=RequestClass.REALTIME)]))
            link.wants.claim = True

    rig = Rig(store, clock, max_batch=8, fail_when=announce)
    rig.daemon = Daemon(store, rig.engine, rig.daemon.encode, rig.daemon.config, clock=clock,
                        sleep=clock.advance, link=link)
    return rig


def _turns(events: list[tuple[str, ...]]) -> list[list[tuple[str, ...]]]:
    """The writes that followed each step, up to the next."""
    turns: list[list[tuple[str, ...]]] = []
    for event in events:
        if event == ("step",):
            turns.append([])
        elif turns:
            turns[-1].append(event)
    return turns


def test_a_steps_completions_tokens_and_announced_claim_go_in_one_transaction():
    clock = FakeClock(tick=0.001)
    store = TransactionStore(clock)
    rig = _realtime_rig(store, clock)
    rig.run()
    turns = _turns(store.events)
    assert ("write", "tokens", "completions", "claim") in [w for turn in turns for w in turn]
    # A step's output (tokens, completions) is written in one transaction: never two after one step.
    assert max(sum(1 for w in turn if {"tokens", "completions"} & set(w)) for turn in turns) == 1
    assert {r.status.succeeded for r in store.requests()} == {True}
    assert outputs(store) == reference(store)


def test_a_step_transaction_the_table_fails_loses_and_repeats_nothing():
    """The first five step transactions carrying a completion and a claim fail (nothing of it is written):
    the completions and tokens are written with a later one, the claim is made again, and every request
    ends once, claimed once, with the reference output."""
    clock = FakeClock(tick=0.001)
    failed = []

    def fail_when(carried: tuple[str, ...]) -> bool:
        if {"completions", "claim"} <= set(carried) and len(failed) < 5:
            failed.append(carried)
            return True
        return False

    store = TransactionStore(clock, fail_when)
    rig = _realtime_rig(store, clock)
    rig.run()
    assert len(failed) == 5
    assert {r.status.succeeded for r in store.requests()} == {True}
    assert all(r.attempts == 1 for r in store.requests())
    assert outputs(store) == reference(store)
    assert rig.daemon.fenced_writes == 0 and store.refused == 0
