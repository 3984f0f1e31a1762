"""Waiting requests: two heaps per policy group, best head picked by rank.

Keys inside a heap never change while a request waits, so each heap stays
valid; what does change (tenant scores, aging) is applied to the group
heads only, when picking: O(groups) per pick, O(log n) per push and pop.
A group's `aging` heap is ordered by the policy's `heap_key` (for fsched:
longest wait first, i.e. most aged first); a request that `settles_at` a
time no longer ages and moves lazily to the `settled` heap, ordered by
arrival.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Mapping

from fsched.core.policy import INF, Policy
from fsched.core.schedreq import SchedRequest

_Heap = list[tuple[tuple, SchedRequest]]


class _Group:
    __slots__ = ("aging", "settled")

    def __init__(self) -> None:
        self.aging: _Heap = []
        self.settled: _Heap = []

    def __bool__(self) -> bool:
        return bool(self.aging or self.settled)


class WaitQueue:
    __slots__ = ("_policy", "_groups", "_len")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._groups: dict[Hashable, _Group] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[SchedRequest]:
        for g in self._groups.values():
            for _, r in g.aging:
                yield r
            for _, r in g.settled:
                yield r

    def push(self, r: SchedRequest) -> None:
        key = self._policy.group(r)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group()
        heapq.heappush(g.aging, (self._policy.heap_key(r), r))
        self._len += 1

    def _settle(self, g: _Group, now: float) -> None:
        settles_at = self._policy.settles_at
        while g.aging and settles_at(g.aging[0][1]) <= now:
            _, r = heapq.heappop(g.aging)
            heapq.heappush(g.settled, ((r.arrival, r.seq), r))

    def best(
        self,
        now: float,
        scores: Mapping[str, float],
        eligible: Callable[[SchedRequest], bool] | None = None,
    ) -> tuple[tuple, SchedRequest] | None:
        """The best waiting request and its rank, or None when there is none.

        `eligible` filters on what a whole group shares (class, level,
        tenant, priority): testing the heads is testing every member.
        """
        rank = self._policy.rank
        best: tuple[tuple, SchedRequest] | None = None
        for g in self._groups.values():
            self._settle(g, now)
            for heap in (g.settled, g.aging):
                if not heap:
                    continue
                head = heap[0][1]
                if eligible is not None and not eligible(head):
                    break
                r_rank = rank(head, now, scores)
                if best is None or r_rank < best[0]:
                    best = (r_rank, head)
        return best

    def pop_head(self, r: SchedRequest) -> None:
        """Remove `r`, which must be a head of its group (as `best` returns)."""
        key = self._policy.group(r)
        g = self._groups[key]
        for heap in (g.settled, g.aging):
            if heap and heap[0][1] is r:
                heapq.heappop(heap)
                break
        else:
            raise ValueError(f"{r.id} is not at the head of its group")
        if not g:
            del self._groups[key]
        self._len -= 1

    def remove(self, r: SchedRequest) -> bool:
        """Remove `r` from anywhere in its group (cancellation): O(group size)."""
        key = self._policy.group(r)
        g = self._groups.get(key)
        if g is None:
            return False
        for heap in (g.aging, g.settled):
            for i, (_, other) in enumerate(heap):
                if other is r:
                    heap[i] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    if not g:
                        del self._groups[key]
                    self._len -= 1
                    return True
        return False

    def next_change(self, now: float) -> float:
        """Earliest time a group head's rank changes by aging.

        Within a group's aging heap the head has waited longest, so it ages
        first; settled requests no longer change.
        """
        soonest = INF
        change = self._policy.next_change
        for g in self._groups.values():
            if g.aging:
                t = change(g.aging[0][1], now)
                if t < soonest:
                    soonest = t
        return soonest
