"""The requests a daemon holds: the counts by (tenant, class) a claim reads, kept as requests come and go,
equal a count of what is held after any sequence of claims, re-claims and ends."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fsched.core.daemon.holdings import Holdings
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass

moves = st.lists(st.tuples(st.sampled_from(["add", "pop"]), st.integers(0, 6), st.sampled_from(["a", "b"]),
                           st.sampled_from(list(RequestClass))), max_size=60)


@given(moves)
def test_the_counts_by_group_are_those_of_the_held_requests(steps):
    held = Holdings()
    for move, n, tenant, request_class in steps:
        if move == "add":  # a claim, or a claim again of one held (another record: its old one leaves)
            held.add(Request(f"r{n}", tenant, request_class, 10, 10, 0.0))
        else:
            held.pop(f"r{n}")
        counted: dict[tuple[str, RequestClass], int] = {}
        for _, request in held:
            group = (request.tenant, request.request_class)
            counted[group] = counted.get(group, 0) + 1
        assert held.per_group() == counted
