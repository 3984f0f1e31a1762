"""Policies: the aging rule, each policy's order, preemption rights, the factory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.policy import INF, POLICIES, aged, make_policy, next_aging_change
from fsched.core.sched.request import SchedRequest
from fsched.core.sched.waitqueue import WaitQueue
from fsched.core.types import RequestClass

RT, ST, BA = RequestClass.REALTIME, RequestClass.STREAMING, RequestClass.BATCH
CFG = SchedulerConfig(aging_s=10.0)


def r(rid, cls=BA, tenant="t", prompt=100, arrival=0.0, prio=5, seq=0, level=None):
    x = SchedRequest(rid, tenant, cls, prompt, 10, arrival, priority=prio)
    x.seq = seq
    x.wait_since = arrival
    x.level = x.admit_level = CFG.entry_level(prompt) if level is None else level
    return x


def test_aging_improves_band_then_boosts_level_and_priority():
    assert aged(2, 3, 7, 0.0, 10.0) == (2, 3, 7)
    assert aged(2, 3, 7, 9.9, 10.0) == (2, 3, 7)
    assert aged(2, 3, 7, 10.0, 10.0) == (1, 3, 7)
    assert aged(2, 3, 7, 20.0, 10.0) == (0, 3, 7)
    assert aged(2, 3, 7, 30.0, 10.0) == (0, 0, 0)
    assert aged(0, 2, 5, 10.0, 10.0) == (0, 0, 0)


@given(
    band=st.integers(0, 2), level=st.integers(0, 3), prio=st.integers(0, 9),
    waited=st.floats(0, 1e4), aging=st.floats(0.1, 100),
)
def test_aging_is_monotone_and_next_change_is_exact(band, level, prio, waited, aging):
    now = 1000.0
    since = now - waited
    waited = now - since  # the same float next_aging_change sees
    cur = aged(band, level, prio, waited, aging)
    later = aged(band, level, prio, waited + aging / 3, aging)
    assert later <= cur
    t = next_aging_change(band, level, prio, since, now, aging)
    if t == INF:
        assert cur == (0, 0, 0) or aged(band, level, prio, waited + 1e6, aging) == cur
    else:
        assert t > now - 1e-9
        assert aged(band, level, prio, t - since - 1e-6, aging) == cur
        assert aged(band, level, prio, t - since + 1e-6, aging) != cur


def pop_order(policy_name, requests, now=0.0, scores=None):
    policy = make_policy(policy_name, CFG, {})
    q = WaitQueue(policy)
    for x in requests:
        q.push(x)
    scores = scores or {x.tenant: 0.0 for x in requests}
    order = []
    while len(q):
        _, best = q.best(now, scores)
        q.pop_head(best, now)
        order.append(best.id)
    return order


def test_fcfs_is_arrival_order():
    reqs = [r("b", BA, arrival=1, seq=1), r("r", RT, arrival=2, seq=2), r("a", ST, arrival=0)]
    assert pop_order("fcfs", reqs) == ["a", "b", "r"]


def test_priority_is_class_then_base_priority_then_arrival_without_aging():
    reqs = [
        r("b-old", BA, arrival=0, seq=0),
        r("s", ST, arrival=5, seq=1),
        r("r-p9", RT, arrival=6, prio=9, seq=2),
        r("r-p1", RT, arrival=7, prio=1, seq=3),
    ]
    assert pop_order("priority", reqs, now=10_000) == ["r-p1", "r-p9", "s", "b-old"]


def test_vtc_picks_lowest_counter_tenant_then_its_oldest():
    reqs = [r("x1", tenant="x", arrival=0), r("y1", tenant="y", arrival=1, seq=1)]
    assert pop_order("vtc", reqs, scores={"x": 5.0, "y": 1.0}) == ["y1", "x1"]


def test_fsched_order_band_tenant_level_priority_arrival():
    reqs = [
        r("batch", BA, tenant="low", arrival=9.0, seq=0),
        r("rt-heavy", RT, tenant="high", prompt=100, arrival=9.1, seq=1),
        r("rt-long", RT, tenant="low", prompt=5000, arrival=9.2, seq=2),  # skip-join: level 2
        r("rt-p1", RT, tenant="low", prompt=100, arrival=9.4, prio=1, seq=3),
        r("rt-p5", RT, tenant="low", prompt=100, arrival=9.3, prio=5, seq=4),
    ]
    order = pop_order("fsched", reqs, now=9.5, scores={"low": 0.1, "high": 0.9})
    assert order == ["rt-p1", "rt-p5", "rt-long", "rt-heavy", "batch"]


def test_fsched_aged_batch_reaches_the_top_band_and_a_preempted_request_keeps_its_place():
    def pair():
        return [r("old-batch", BA, arrival=0.0, seq=0), r("fresh-rt", RT, arrival=14.0, seq=1)]

    assert pop_order("fsched", pair(), now=19.9) == ["fresh-rt", "old-batch"]  # band 1 vs 0
    assert pop_order("fsched", pair(), now=20.0) == ["old-batch", "fresh-rt"]  # both band 0
    # Preempted (wait reset at 100) but arrived first: once settled it goes
    # before the younger requests that have waited longer.
    pre = r("preempted", BA, arrival=0.0, seq=0)
    pre.wait_since = 100.0
    younger = [r(f"y{i}", BA, arrival=50.0 + i, seq=i + 1) for i in range(3)]
    assert pop_order("fsched", [pre, *younger], now=131.0)[0] == "preempted"


def test_may_preempt_compares_own_class_not_aged_band():
    p = make_policy("fsched", CFG, {})
    victim = r("v", BA)
    assert p.may_preempt(r("w", RT), victim)
    assert p.may_preempt(r("w", ST), victim)
    assert not p.may_preempt(r("w", BA, prompt=10), victim)  # same class, even if aged
    rt_victim = r("rv", RT, prompt=100)
    rt_victim.level = 1  # used up the quantum it was admitted with (level 0)
    assert p.may_preempt(r("w", RT, prompt=10), rt_victim)  # time slicing
    rt_victim.admit_level = 1
    assert not p.may_preempt(r("w", RT, prompt=10), rt_victim)
    assert not make_policy("fcfs", CFG, {}).may_preempt(r("w", RT), victim)
    assert not make_policy("vtc", CFG, {}).may_preempt(r("w", RT), victim)
    assert make_policy("priority", CFG, {}).may_preempt(r("w", RT), victim)


def test_factory_knows_the_four_policies_and_rejects_others():
    assert set(POLICIES) == {"fcfs", "priority", "vtc", "fsched"}
    for name in POLICIES:
        assert make_policy(name, CFG, {"a": 2}).name == name
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lottery", CFG, {})


def test_waitqueue_remove_and_next_change():
    p = make_policy("fsched", CFG, {})
    q = WaitQueue(p)
    reqs = [r(str(i), BA, arrival=float(i), seq=i) for i in range(5)]
    for x in reqs:
        q.push(x)
    assert q.remove(reqs[2], 5.0) and not q.remove(reqs[2], 5.0)
    assert len(q) == 4 and reqs[2] not in list(q)
    assert q.next_change(5.0) == 10.0  # request 0 (waiting since 0) reaches band 1 at 10 s


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(list(RequestClass)), st.sampled_from("xyz"),
                  st.integers(1, 9_000), st.integers(0, 9)),
        st.tuples(st.just("pop")),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("wait"), st.floats(0.0, 25.0)),
        st.tuples(st.just("score"), st.sampled_from("xyz"), st.floats(0.0, 10.0)),
    ),
    max_size=120,
)


@given(ops=ops, policy_name=st.sampled_from(["fcfs", "priority", "vtc", "fsched"]))
def test_waitqueue_best_is_the_minimum_rank_over_all_waiting(ops, policy_name):
    """The heads-of-heaps pick equals a brute-force minimum of `rank` over
    every waiting request, as ages and scores change."""
    policy = make_policy(policy_name, CFG, {})
    q = WaitQueue(policy)
    now, seq = 0.0, 0
    scores = {"x": 0.0, "y": 0.0, "z": 0.0}
    live: list[SchedRequest] = []
    for op in ops:
        if op[0] == "add":
            _, cls, tenant, prompt, prio = op
            x = r(f"r{seq}", cls, tenant, prompt, arrival=now, prio=prio, seq=seq)
            seq += 1
            q.push(x, now)
            live.append(x)
        elif op[0] == "wait":
            now += op[1]
        elif op[0] == "score":
            scores[op[1]] = op[2]
        elif op[0] == "cancel" and live:
            victim = live.pop(op[1] % len(live))
            assert q.remove(victim, now)
        elif op[0] == "pop" and live:
            rank, best = q.best(now, scores)
            q.pop_head(best, now)
            live.remove(best)
        assert len(q) == len(live)
        if live:
            expected = min(policy.rank(x, now, scores) for x in live)
            assert q.best(now, scores)[0] == expected
            changes = [policy.next_change(x, now) for x in live]
            assert q.next_change(now) <= min(changes) + 1e-9
        else:
            assert q.best(now, scores) is None
