"""The order inside a tenant's realtime or streaming line: shortest prefill that can still make its
target first, late work behind, aging bounding every wait; the heaps against a brute-force sort."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.lines import (
    FIRST,
    LATE,
    ON_TIME,
    ArrivalLine,
    DeadlineLine,
    band,
    deadline_key,
    on_target,
    restamp_running,
    stamp,
)
from fsched.core.sched.policy import Standing, make_policy
from fsched.core.sched.request import Request
from fsched.core.sched.waitqueue import WaitQueue
from fsched.core.types import RequestClass

RT, ST, BA = RequestClass.REALTIME, RequestClass.STREAMING, RequestClass.BATCH
CFG = SchedulerConfig(step_tokens=2048)  # realtime: target 0.5 s, ages at 2 s
STEP_S = 0.1  # a step with prefill


def req(rid: str, prompt: int, arrival: float, seq: int, request_class=RT) -> Request:
    r = Request(rid, "a", request_class, prompt, 10, arrival)
    r.seq = seq
    stamp(r, CFG, STEP_S)
    return r


def drain(line, now: float) -> list[str]:
    out = []
    while (head := line.head(now)) is not None:
        out.append(head.id)
        line.pop(head)
    return out


def test_on_time_shortest_prefill_first_then_nearest_deadline():
    line = DeadlineLine(CFG)
    for r in (req("long", 4_000, 0.00, 0), req("short-late-arrival", 100, 0.05, 1),
              req("short", 100, 0.01, 2)):
        line.push(r, 0.05)
    # two steps of prefill against one: the one-step prompts first, the earlier deadline first
    assert drain(line, 0.05) == ["short", "short-late-arrival", "long"]


def test_a_request_whose_target_is_out_of_reach_goes_behind_the_on_time_ones():
    long = req("long", 8_000, 0.0, 0)  # four steps of 0.1 s: out of reach from 0.1 s on
    assert long.late_at == pytest.approx(0.1)
    line = DeadlineLine(CFG)
    line.push(long, 0.0)
    line.push(req("short", 3_000, 0.15, 1), 0.15)
    assert band(long, 0.15) == LATE and line.head(0.15).id == "short"
    # a shorter prompt that is late goes behind a longer one still on time
    behind = DeadlineLine(CFG)
    behind.push(req("tiny", 100, 0.0, 5), 0.0)  # late from 0.4 s on
    behind.push(req("mid", 6_000, 0.5, 6), 0.5)  # three steps: on time until 0.7 s
    assert drain(behind, 0.6) == ["mid", "tiny"]
    # a request late when it starts waiting goes straight to the late heap
    late = DeadlineLine(CFG)
    late.push(req("past", 100, 0.0, 2), 1.0)
    late.push(req("fresh", 3_000, 0.9, 3), 1.0)
    assert drain(late, 1.0) == ["fresh", "past"]


def test_aging_bounds_the_wait_behind_a_stream_of_shorter_work():
    """The starvation bound: a request that has waited `aging_factor` x its target goes ahead of
    every request of its line that has not, whatever their lengths; so a long prompt waits at most
    its aging limit plus the older aged work of its own line."""
    line = DeadlineLine(CFG)
    line.push(req("long", 6_000, 0.0, 0), 0.0)
    seq, now, served = 1, 0.0, []
    while now < 3.0:
        line.push(req(f"s{seq}", 50, now, seq), now)  # one short, on-time request a step
        seq += 1
        head = line.head(now)
        line.pop(head)
        served.append((now, head.id))
        now += STEP_S
    when = next(t for t, rid in served if rid == "long")
    limit = CFG.aging_factor * CFG.realtime_target_s
    assert limit <= when < limit + STEP_S


def test_a_started_request_resumes_ahead_of_its_line():
    started = req("started", 100, 0.0, 0)
    started.generated = 3  # preempted after its first token
    line = DeadlineLine(CFG)
    line.push(req("new", 10, 0.4, 1), 0.4)
    line.push(started, 0.4)
    assert band(started, 0.4) == FIRST and line.head(0.4) is started


def test_arrival_line_is_oldest_first_and_removal_is_lazy_and_exact():
    line = ArrivalLine()
    reqs = [req(str(i), 10, float(i), i, BA) for i in range(5)]
    for r in reversed(reqs):
        line.push(r, 5.0)
    assert line.pop(reqs[1]) and not line.pop(reqs[1])
    line.push(reqs[1], 5.0)  # back again (a preemption): counted once
    assert len(line) == 5 and [r.id for r in line.first(5, 5.0)] == ["0", "1", "2", "3", "4"]


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 12_000), st.booleans()),
    st.tuples(st.just("pop"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.floats(0.0, 3.0)),
    st.tuples(st.just("wait"), st.floats(0.0, 90.0)),
), max_size=80)


# A line holds one group: one tenant's requests of one class (the policy's `group`), so one class a line.
@settings(max_examples=100, deadline=None)
@given(ops=ops, shortest_first=st.booleans(), request_class=st.sampled_from([RT, ST, BA]))
def test_the_line_is_a_brute_force_sort_by_deadline_key_at_every_moment(ops, shortest_first, request_class):
    line, live, now, seq = DeadlineLine(CFG, shortest_first), [], 0.0, 0
    for op in ops:
        if op[0] == "add":
            r = req(f"r{seq}", op[1], now, seq, request_class)
            r.generated = int(op[2] and seq % 3 == 0)
            seq += 1
            line.push(r, now)
            live.append(r)
        elif op[0] == "pop" and live:
            victim = live.pop(op[1] % len(live))  # from anywhere (admission, cancellation)
            assert line.pop(victim)
        elif op[0] == "wait":
            now += op[1]
        expected = sorted(live, key=lambda r: deadline_key(r, now, CFG, shortest_first))
        assert line.first(4, now) == expected[:4]
        assert line.head(now) is (expected[0] if expected else None)
        assert len(line) == len(live) and set(line) == set(live)


def test_the_class_order_stays_inside_each_tenants_share():
    """Tenant b's short realtime prompt never passes tenant a's long one when a is further below
    its share: the deadline order orders a tenant's own line only."""
    policy = make_policy("fsched", CFG, {"a": 3, "b": 1})
    queue = WaitQueue(policy)
    long_a = Request("long-a", "a", RT, 4_000, 10, 0.0)
    short_b = Request("short-b", "b", RT, 50, 10, 0.0)
    for seq, r in enumerate((long_a, short_b)):
        r.seq = seq
        stamp(r, CFG, STEP_S)
        queue.push(r, 0.0)
    stand = {"a": Standing(0.5, True, True), "b": Standing(1.0, True, True)}
    assert queue.best(0.0, stand)[1] is long_a
    assert band(long_a, 0.0) == ON_TIME


def test_without_shortest_first_on_time_work_goes_by_arrival_and_late_work_behind():
    """The order measured for batch: on-time work by arrival, whatever its length; work past its
    minute behind it, until it ages (4 minutes)."""
    line = DeadlineLine(CFG, shortest_first=False)
    for r in (req("old-late", 100, 0.0, 0, BA), req("long", 12_000, 10.0, 1, BA),
              req("short", 10, 20.0, 2, BA)):
        line.push(r, 65.0)
    assert drain(line, 65.0) == ["long", "short", "old-late"]
    aged = DeadlineLine(CFG, shortest_first=False)
    for r in (req("older", 100, 0.0, 0, BA), req("fresh", 10, 239.0, 1, BA)):
        aged.push(r, 240.0)
    assert drain(aged, 240.0) == ["older", "fresh"]


def _queue(*requests: Request, now: float) -> WaitQueue:
    queue = WaitQueue(make_policy("fsched", CFG, {"a": 3, "b": 1}))
    for seq, r in enumerate(requests):
        r.seq = seq
        stamp(r, CFG, STEP_S)
        queue.push(r, now)
    return queue


def test_fsched_serves_a_tenants_on_time_batch_before_its_batch_past_its_minute():
    """Batch by deadline inside a tenant: a request that can still make its minute goes before an
    older one that cannot (it goes by arrival when none is late), and a request that has waited
    four minutes goes before both (the bound)."""
    stand = {"a": Standing(1.0, True, True)}
    old = Request("old", "a", BA, 100, 10, 0.0)
    fresh = Request("fresh", "a", BA, 100, 10, 30.0)
    assert _queue(old, fresh, now=50.0).best(50.0, stand)[1] is old  # both on time: by arrival
    old, fresh = Request("old", "a", BA, 100, 10, 0.0), Request("fresh", "a", BA, 100, 10, 30.0)
    queue = _queue(old, fresh, now=70.0)
    assert band(old, 70.0) == LATE and queue.best(70.0, stand)[1] is fresh
    aged = Request("aged", "a", BA, 100, 10, 0.0)
    queue = _queue(aged, Request("new", "a", BA, 100, 10, 239.0), now=240.0)
    assert band(aged, 240.0) == FIRST and queue.best(240.0, stand)[1] is aged


def test_the_batch_order_stays_inside_each_tenants_share():
    """Tenant b's on-time batch never passes tenant a's late batch while a is further below its
    share: late work goes behind its own tenant's on-time work only."""
    late_a = Request("late-a", "a", BA, 100, 10, 0.0)
    fresh_b = Request("fresh-b", "b", BA, 100, 10, 60.0)
    queue = _queue(late_a, fresh_b, now=70.0)
    stand = {"a": Standing(0.5, True, True), "b": Standing(1.0, True, True)}
    assert band(late_a, 70.0) == LATE and queue.best(70.0, stand)[1] is late_a


def test_a_running_prefill_is_on_target_by_the_prefill_it_has_left():
    """`on_target` of a running request follows its progress: stamped for its whole prompt when it
    waited, moved to what is left by `restamp_running` each step."""
    r = req("r", 4_096, 0.0, 0)  # two steps of 0.1 s: out of reach from 0.3 s
    assert on_target(r, 0.25) and not on_target(r, 0.35)
    r.computed = 4_096 - 124  # one step left
    restamp_running([r], CFG, STEP_S)
    assert on_target(r, 0.35) and not on_target(r, 0.45)
    r.generated = 1  # its first token is out: nothing left to make
    assert not on_target(r, 0.0)
