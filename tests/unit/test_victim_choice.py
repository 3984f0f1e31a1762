"""Victim choice over a whole running set (`victim_keys`, `largest_first`) decides exactly as the
row-by-row choice it replaced: the same victims, in the same order, with the same checkpoints, for
every policy, on random running sets, standings and rooms (ties in every part of the key included).

`_reference_*` below are the row-by-row versions of the order, kept verbatim as the specification; the
room is then made from either order by the same `take_for_room`."""

from __future__ import annotations

import random

import pytest

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.policy import BATCH_BAND, POLICIES, Standing, make_policy
from fsched.core.sched.preemption import (
    OutsideOrder,
    Room,
    choose_victims,
    largest_first,
    preemptible,
    take_for_room,
)
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass

CLASSES = list(RequestClass)


def _reference_victim_order(name, waiter, victim, stand):
    if name in ("fcfs", "vtc"):
        return None
    if name == "priority":
        if (waiter.request_class.band, waiter.priority) >= (victim.request_class.band, victim.priority):
            return None
        return (victim.request_class.band, victim.priority, victim.arrival, victim.seq)
    standing = stand[victim.tenant]
    victim_band, waiter_band = victim.request_class.band, waiter.request_class.band
    if victim_band < BATCH_BAND and standing.precedence:
        if victim.tenant == waiter.tenant:
            behind = (waiter_band, waiter.priority) < (victim_band, victim.priority)
        else:
            behind = waiter_band < victim_band and standing.score > stand[waiter.tenant].score
        return (0, victim_band, victim.priority, victim.arrival, victim.seq) if behind else None
    return (1, standing.score, -victim.computed / victim.context, victim.arrival, victim.seq)


def _reference_preemptible(r, config):
    if r.preemptions >= config.max_preemptions:
        return False
    return r.preemptions == 0 or r.run_steps >= config.min_quantum_steps


def _reference_choose_victims(name, waiter, running, room, need_kv, stand, config):
    ordered = []
    for r in running:
        if not _reference_preemptible(r, config):
            continue
        key = _reference_victim_order(name, waiter, r, stand)
        if key is not None:
            ordered.append((key, r))
    ordered.sort(key=lambda item: item[0], reverse=True)
    return take_for_room([r for _, r in ordered], room, need_kv, config)


def _request(rng, rid, tenants):
    prompt = rng.choice([1, 8, 50, 200, 900, 3000])
    r = Request(rid, rng.choice(tenants), rng.choice(CLASSES), prompt, 500, rng.choice([0.0, 0.5, 1.0]),
                priority=rng.randint(4, 6))
    r.generated = rng.choice([0, 0, 3, 40])
    r.computed = rng.choice([0, r.context - 1, r.context, rng.randint(0, r.context)])
    r.preemptions = rng.choice([0, 0, 0, 1, 2])
    r.run_steps = rng.choice([0, 5, 16, 40])
    r.seq = rng.randint(0, 60)  # small range: equal keys occur, and their order must hold too
    return r


def _state(seed):
    rng = random.Random(seed)
    tenants = ["a", "b", "c"][: rng.randint(1, 3)]
    config = SchedulerConfig(min_quantum_steps=rng.choice([1, 16]), max_preemptions=rng.choice([1, 2, 3]),
                             max_recompute_tokens=rng.choice([64, 2048]))
    running = [_request(rng, f"r{i}", tenants) for i in range(rng.randint(0, 60))]
    waiter = _request(rng, "w", tenants)
    stand = {t: Standing(rng.choice([0.5, 1.0, 1.0, 2.0]), rng.random() < 0.8, rng.random() < 0.7)
             for t in tenants}
    room = Room(rng.choice([-1, 0, 0, 1]), rng.choice([-500, 0, 200, 5000]),
                rng.choice([0, 100, 1000, 100_000]))
    need_kv = rng.choice([1, 100, 1000, 4000])
    return config, running, waiter, stand, room, need_kv


def _decisions(victims):
    return None if victims is None else [(r.id, checkpoint) for r, checkpoint in victims]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_choose_victims_decides_as_the_row_by_row_choice(name):
    chose = 0
    for seed in range(1500):
        config, running, waiter, stand, room, need_kv = _state(seed)
        policy = make_policy(name, config, {})
        new = choose_victims(waiter, running, room, need_kv, policy, stand, config)
        old = _reference_choose_victims(name, waiter, running, room, need_kv, stand, config)
        assert _decisions(new) == _decisions(old), seed
        chose += bool(new)
        for r in running:
            assert preemptible(r, config) == _reference_preemptible(r, config)
            assert policy.victim_order(waiter, r, stand) == _reference_victim_order(name, waiter, r, stand)
    if POLICIES[name].preemptive:
        assert chose > 100  # the states do exercise the choice


def test_the_outside_order_decides_as_the_row_by_row_choice_through_a_pass():
    """fsched's victims outside the precedence tier, kept in order through a pass (`OutsideOrder`) while
    rows leave (preempted) and join (admitted) and the standings move: at every turn the row-by-row order's
    outside rows (key 1) in its order, equal keys included, and the same decisions."""
    chose = 0
    for seed in range(300):
        config, rows, _, _, _, _ = _state(seed)
        rng = random.Random(seed)
        tenants = sorted({r.tenant for r in rows}) or ["a"]
        running = {r.id: r for r in rows}
        admitted: list[str] = []
        policy = make_policy("fsched", config, {})
        order = OutsideOrder(policy, running, admitted, config)
        for turn in range(8):
            if running and rng.random() < 0.7:
                del running[rng.choice(list(running))]
            if rng.random() < 0.7:
                joining = _request(rng, f"j{turn}", tenants)
                running[joining.id] = joining
                admitted.append(joining.id)
            stand = {t: Standing(rng.choice([0.5, 1.0, 2.0]), True, rng.random() < 0.6) for t in tenants}
            waiter = _request(rng, "w", tenants)
            keyed = [(key, r) for r in running.values() if _reference_preemptible(r, config)
                     if (key := _reference_victim_order("fsched", waiter, r, stand)) is not None]
            keyed.sort(key=lambda item: item[0], reverse=True)
            assert list(order.ordered(stand)) == [r for key, r in keyed if key[0] == 1], (seed, turn)
            room = Room(rng.choice([0, 0, 1]), rng.choice([-500, 0, 200]), rng.choice([0, 1000, 100_000]))
            need_kv = rng.choice([1, 100, 1000, 4000])
            new = choose_victims(waiter, running.values(), room, need_kv, policy, stand, config, order)
            old = _reference_choose_victims("fsched", waiter, list(running.values()), room, need_kv, stand,
                                            config)
            assert _decisions(new) == _decisions(old), (seed, turn)
            chose += bool(new)
    assert chose > 200  # the turns do choose victims


def test_largest_first_is_the_stable_descending_sort_lazily():
    rng = random.Random(3)
    for _ in range(500):
        keyed = [((rng.randint(0, 3), rng.randint(0, 3)), f"r{i}") for i in range(rng.randint(0, 30))]
        expected = [r for _, r in sorted(keyed, key=lambda item: item[0], reverse=True)]
        for picks in (0, 1, 3, 8, 100):
            assert list(largest_first([k for k, _ in keyed], [r for _, r in keyed], picks)) == expected


def _plans(name, seed, choose=None, monkeypatch=None, tenants="ab", batches=(4, 16)):
    """Every plan of a random run of `name` (bursts of every class over a full batch), with `choose` in
    place of the scheduler's victim choice when given."""
    from fsched.core.sched import scheduler as scheduler_module
    from fsched.core.sched.plan import Outcome
    from fsched.core.sched.scheduler import Scheduler

    if choose is not None:
        monkeypatch.setattr(scheduler_module, "choose_victims", choose)
    rng = random.Random(seed)
    scheduler = Scheduler(SchedulerConfig(max_batch=rng.choice(batches), kv_tokens=6000, host_kv_tokens=2000,
                                          min_quantum_steps=rng.choice([2, 16])), name)
    plans, now = [], 0.0
    for step in range(80):
        now += 0.05
        for i in range(rng.choice([0, 0, 0, 1, 6])):
            scheduler.add(Request(f"s{step}-{i}", rng.choice(tenants), rng.choice(CLASSES),
                                  rng.randint(1, 400), rng.randint(1, 60), now, priority=rng.randint(4, 6)))
        plan = scheduler.schedule(now)
        plans.append(repr(plan))
        produced = {rid: 1 for rid in plan.producing()}
        scheduler.postprocess(plan, Outcome(elapsed_s=0.05, produced=produced), now)
    return plans


@pytest.mark.parametrize(("name", "tenants", "batches"), [
    ("priority", "ab", (4, 16)), ("fsched", "ab", (4, 16)), ("fsched", "abcd", (8, 32))])
def test_scheduler_plans_as_with_the_row_by_row_choice(name, tenants, batches, monkeypatch):
    """fsched's pass keeps the order of its victims outside the precedence tier (`OutsideOrder`) across
    its waiters; the row-by-row reference reads every row's key for each one. Same plans."""
    def reference(waiter, running, room, need_kv, policy, stand, config, outside=None):
        return _reference_choose_victims(name, waiter, list(running), room, need_kv, stand, config)

    preempted = 0
    for seed in range(12):
        new = _plans(name, seed, tenants=tenants, batches=batches)
        with monkeypatch.context() as m:
            old = _plans(name, seed, reference, m, tenants=tenants, batches=batches)
        assert new == old, seed
        preempted += sum("Preemption(" in p for p in new)
    assert preempted > 20  # the runs do preempt
