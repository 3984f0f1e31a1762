"""Policies: standings, each policy's order, preemption rights and victim order, the factory,
and the wait queue's pick against a brute-force minimum."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.lines import stamp
from fsched.core.sched.planning import split_rows
from fsched.core.sched.policy import POLICIES, Standing, make_policy, standings
from fsched.core.sched.request import Request
from fsched.core.sched.waitqueue import WaitQueue
from fsched.core.types import RequestClass

RT, ST, BA = RequestClass.REALTIME, RequestClass.STREAMING, RequestClass.BATCH
CFG = SchedulerConfig()
IN = Standing(1.0, True, True)


def r(rid, request_class=BA, tenant="t", prompt=100, arrival=0.0, prio=5, seq=0):
    x = Request(rid, tenant, request_class, prompt, 10, arrival, priority=prio)
    x.seq = seq
    x.wait_since = arrival
    return x


def running(*requests: Request) -> None:
    """Admitted in this order, each with its class's lines at the modelled step time."""
    for seq, x in enumerate(requests):
        x.seq = seq
        stamp(x, CFG, 0.137)


def first_chunk(policy, rows, stand, now) -> str:
    """The request whose prefill takes the step's budget first among running `rows`."""
    _, chunks = split_rows(rows, lambda x: policy.running_rank(x, stand, now), CFG.step_tokens,
                           CFG.min_quantum_steps, lambda x: policy.due(x, now))
    return chunks[0].request_id


def order(policy, reqs, now, stand):
    return [x.id for x in sorted(reqs, key=lambda x: policy.rank(x, now, stand))]


def test_standings_in_share_within_the_slack_of_the_lowest_waiting_score():
    s = standings({"a": 1.0, "b": 1.04, "c": 1.2, "idle": 0.1}, backlogged=["a", "b", "c"], slack=0.05)
    assert [s[t].in_share for t in "abc"] == [True, True, False]
    assert s["idle"].in_share  # below everyone: not waiting, still within its share
    assert all(x.in_share for x in standings({"a": 5.0, "b": 1.0}, [], 0.05).values())  # none waits


def test_standings_precedence_by_recent_realtime_and_streaming_use_against_entitlement():
    s = standings({"a": 1.0, "b": 1.0}, ["a", "b"], 0.05, precedence_use={"a": 0.2, "b": 0.27},
                  entitled={"a": 0.75, "b": 0.25})
    assert s["a"].precedence and not s["b"].precedence  # 0.27 > 0.25 x 1.05
    assert standings({"b": 1.0}, ["b"], 0.05, {"b": 0.26}, {"b": 0.25})["b"].precedence


def test_fcfs_is_arrival_order():
    p = make_policy("fcfs", CFG, {})
    reqs = [r("2", RT, arrival=2.0, seq=2), r("1", BA, arrival=1.0, seq=1)]
    assert order(p, reqs, 5.0, {}) == ["1", "2"]


def test_priority_is_class_then_base_priority_then_arrival():
    p = make_policy("priority", CFG, {})
    reqs = [r("b", BA, arrival=0.0), r("s9", ST, prio=9, arrival=1.0, seq=1),
            r("s1", ST, prio=1, arrival=2.0, seq=2), r("rt", RT, arrival=3.0, seq=3)]
    assert order(p, reqs, 1000.0, {}) == ["rt", "s1", "s9", "b"]  # no aging, however long b waits


def test_vtc_picks_lowest_counter_tenant_then_its_oldest():
    p = make_policy("vtc", CFG, {})
    reqs = [r("x1", RT, "x", arrival=0.0), r("y2", BA, "y", arrival=2.0, seq=2),
            r("y1", BA, "y", arrival=1.0, seq=1)]
    assert order(p, reqs, 5.0, {"x": Standing(9.0), "y": Standing(1.0)}) == ["y1", "y2", "x1"]


def test_fsched_precedence_tier_first_then_drf_by_score():
    """In-share realtime/streaming go first (class, then arrival, across tenants);
    batch and the work of a tenant without precedence follow by tenant score."""
    p = make_policy("fsched", CFG, {})
    stand = {"a": Standing(2.0, True, True), "b": Standing(1.0, True, True), "c": Standing(0.5, True, False)}
    reqs = [r("a-st", ST, "a", arrival=0.0), r("b-rt", RT, "b", arrival=1.0, seq=1),
            r("a-rt", RT, "a", arrival=2.0, seq=2), r("a-ba", BA, "a", arrival=3.0, seq=3),
            r("b-ba", BA, "b", arrival=4.0, seq=4), r("c-rt", RT, "c", arrival=0.0, seq=5)]
    # c labels realtime but has used its precedence: it competes by score (lowest here).
    assert order(p, reqs, 5.0, stand) == ["b-rt", "a-rt", "a-st", "c-rt", "b-ba", "a-ba"]


def test_fsched_long_waiting_batch_never_jumps_another_tenant():
    """However long a's batch waited, b (lower score) goes first; within a, oldest first."""
    p = make_policy("fsched", CFG, {})
    old, older = r("old", BA, "a", arrival=10.0, seq=1), r("older", BA, "a", arrival=0.0)
    fresh = r("fresh", BA, "b", arrival=999.0, seq=2)
    stand = {"a": Standing(2.0, True, True), "b": Standing(1.0, True, True)}
    assert order(p, [old, fresh, older], 1000.0, stand) == ["fresh", "older", "old"]


def test_fsched_preemption_rights_and_victim_order():
    p = make_policy("fsched", CFG, {})
    stand = {"a": Standing(1.0, True, True), "b": Standing(3.0, False, False)}
    rt_a, ba_a = r("rt-a", RT, "a"), r("ba-a", BA, "a")
    assert p.may_preempt(rt_a, 0.0, stand) and not p.may_preempt(ba_a, 0.0, stand)
    assert not p.may_preempt(r("rt-b", RT, "b"), 0.0, stand)  # b used up its precedence
    st_a = r("st-a", ST, "a")
    # Precedence work is a victim only of precedence work ahead of it in the tier's order.
    assert p.victim_order(r("st-a2", ST, "a", seq=3), st_a, stand) is None
    assert p.victim_order(r("rt-a2", RT, "a", seq=3), r("rt-a3", RT, "a", seq=4), stand) is None
    both = {"a": Standing(1.0, True, True), "b": Standing(1.0, True, True)}
    assert p.victim_order(rt_a, r("st-b", ST, "b"), both) is None  # nor of another tenant's label
    # ... unless that tenant is further over its share: then its worse class only
    b_ahead = {"a": Standing(1.0, True, True), "b": Standing(1.2, True, True)}
    assert p.victim_order(rt_a, r("st-b", ST, "b"), b_ahead) is not None
    assert p.victim_order(rt_a, r("rt-b", RT, "b"), b_ahead) is None
    assert p.victim_order(r("st-a3", ST, "a"), r("st-b", ST, "b"), b_ahead) is None
    cheap, dear = r("cheap", BA, "b", prompt=1000), r("dear", BA, "b", prompt=1000, seq=1)
    cheap.computed, dear.computed = 100, 900
    own = r("own", BA, "a", prompt=1000, seq=2)
    victims = sorted([st_a, own, dear, cheap], key=lambda v: p.victim_order(rt_a, v, stand), reverse=True)
    # Furthest over its share, then cheapest; precedence streaming only after all work outside it.
    assert [v.id for v in victims] == ["cheap", "dear", "own", "st-a"]


def test_priority_preempts_only_strictly_worse_class_or_priority():
    p = make_policy("priority", CFG, {})
    w = r("w", ST, prio=5)
    assert p.victim_order(w, r("v", BA), {}) is not None
    assert p.victim_order(w, r("v", ST, prio=5), {}) is None
    assert p.victim_order(w, r("v", ST, prio=6), {}) is not None
    assert p.victim_order(w, r("v", RT), {}) is None


def test_factory_knows_the_four_policies_and_rejects_others():
    assert set(POLICIES) == {"fcfs", "priority", "vtc", "fsched"}
    for name in POLICIES:
        assert make_policy(name, CFG, {"a": 2}).name == name
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lottery", CFG, {})


def test_waitqueue_remove():
    p = make_policy("fsched", CFG, {})
    q = WaitQueue(p)
    reqs = [r(str(i), BA, arrival=float(i), seq=i) for i in range(5)]
    for x in reqs:
        q.push(x, x.arrival)
    assert q.remove(reqs[2], 5.0) and not q.remove(reqs[2], 5.0)
    assert len(q) == 4 and reqs[2] not in list(q)
    assert q.best(5.0, {"t": IN})[1] is reqs[0]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(list(RequestClass)), st.sampled_from("xyz"),
                  st.integers(1, 9_000), st.integers(0, 9)),
        st.tuples(st.just("pop")),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("wait"), st.floats(0.0, 25.0)),
        st.tuples(st.just("score"), st.sampled_from("xyz"), st.floats(0.0, 10.0), st.booleans(),
                  st.booleans()),
    ),
    max_size=120,
)


@given(ops=ops, policy_name=st.sampled_from(["fcfs", "priority", "vtc", "fsched"]))
def test_waitqueue_best_is_the_minimum_rank_over_all_waiting(ops, policy_name):
    """The heads-of-heaps pick equals a brute-force minimum of `rank` over
    every waiting request, as the standings change; `ranked` equals the
    brute-force order's first few."""
    policy = make_policy(policy_name, CFG, {})
    q = WaitQueue(policy)
    now, seq = 0.0, 0
    stand = {"x": IN, "y": IN, "z": IN}
    live: list[Request] = []
    for op in ops:
        if op[0] == "add":
            _, request_class, tenant, prompt, prio = op
            x = r(f"r{seq}", request_class, tenant, prompt, arrival=now, prio=prio, seq=seq)
            stamp(x, CFG, 0.1)  # late and aged as time passes (lines.py): the pick must follow
            seq += 1
            q.push(x, now)
            live.append(x)
        elif op[0] == "wait":
            now += op[1]
        elif op[0] == "score":
            stand[op[1]] = Standing(op[2], op[3], op[4])
        elif op[0] == "cancel" and live:
            victim = live.pop(op[1] % len(live))
            assert q.remove(victim, now)
        elif op[0] == "pop" and live:
            _, best = q.best(now, stand)
            q.pop_head(best, now)
            live.remove(best)
        assert len(q) == len(live)
        if live:
            assert q.best(now, stand)[0] == min(policy.rank(x, now, stand) for x in live)
            by_rank = sorted(live, key=lambda x: policy.rank(x, now, stand))
            assert q.ranked(now, stand, 5) == by_rank[:5]  # what backfill looks at
        else:
            assert q.best(now, stand) is None


def test_fsched_running_prefill_that_can_make_its_target_goes_before_one_that_cannot_across_tenants():
    """In the precedence tier a running prefill still on target takes the step's budget before a
    prefill of its class past its target, even of the tenant further below its share: a long
    realtime prompt that missed 0.5 s no longer holds another tenant's short one for seconds."""
    policy = make_policy("fsched", CFG, {"a": 3, "b": 1})
    stand = {"a": Standing(0.5, True, True), "b": Standing(1.0, True, True)}
    long_a = Request("long-a", "a", RT, 40_000, 10, 0.0)
    short_b = Request("short-b", "b", RT, 50, 10, 1.0)
    running(long_a, short_b)  # long_a: 20 steps, out of reach from its arrival on

    assert first_chunk(policy, [long_a, short_b], stand, 1.05) == "short-b"
    # once short_b too is past its target the tenants' standing orders them again, as in `rank`
    assert first_chunk(policy, [long_a, short_b], stand, 1.6) == "long-a"
    # and the waiting order is unchanged: a's long prompt first
    assert order(policy, [short_b, long_a], 1.05, stand) == ["long-a", "short-b"]


def test_fsched_running_prefills_of_the_share_tier_take_the_budget_in_arrival_order():
    """Batch prompts already admitted prefill oldest first whatever their tenants' scores: the scores
    chose who was admitted; a's later prompt does not hold b's admitted one (and its KV) idle."""
    policy = make_policy("fsched", CFG, {"a": 3, "b": 1})
    stand = {"a": Standing(0.5, True, True), "b": Standing(1.0, True, True)}
    early_b = Request("early-b", "b", BA, 8_000, 10, 0.0)
    late_a = Request("late-a", "a", BA, 8_000, 10, 1.0)
    running(early_b, late_a)
    assert first_chunk(policy, [late_a, early_b], stand, 2.0) == "early-b"
    # waiting, the scores still order them: a's first
    assert order(policy, [early_b, late_a], 2.0, stand) == ["late-a", "early-b"]
