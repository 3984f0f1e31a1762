"""Waiting requests: heaps whose order stays valid while scores and ages move.

Three layers:

* **Groups** (`policy.group`): requests that share every part of the rank
  except their wait time. Each group has an `aging` heap (longest wait
  first, i.e. most aged first) and a `settled` heap (by arrival) for
  requests that no longer age (`policy.settles_at`). The group's head is
  the better of the two heap tops.
* **Partitions** (`policy.partition` (the tenant), class band): a heap of
  group heads keyed by the score-free `static_rank`. Within a partition
  every request has the same score, so this order is the rank order; the
  band lets a preemption find the best waiter of a better class without
  scanning.
* **Timers**: when a head's static rank changes by aging
  (`policy.next_change`), its group is refreshed then.

A pick composes each partition's top with its score and takes the best:
O(partitions) plus O(log n) heap work. Entries are invalidated lazily by
a per-group version number.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Mapping

from fsched.core.sched.policy import INF, Policy
from fsched.core.sched.request import SchedRequest

_Entry = tuple[tuple, SchedRequest]


class _Group:
    __slots__ = ("key", "band", "aging", "settled", "version")

    def __init__(self, key: Hashable, band: int) -> None:
        self.key = key
        self.band = band  # class band shared by the members
        self.aging: list[_Entry] = []
        self.settled: list[_Entry] = []
        self.version = 0

    def __bool__(self) -> bool:
        return bool(self.aging or self.settled)


class WaitQueue:
    __slots__ = ("_policy", "_groups", "_by_band", "_parts", "_timers", "_len", "_tick")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._groups: dict[Hashable, _Group] = {}
        self._by_band: dict[int, dict[Hashable, _Group]] = {}  # class band -> its groups
        # (tenant, band) -> heap of (static rank, version, tick, group, head);
        # the tick is unique, so entries never compare further
        self._parts: dict[tuple[str, int], list[tuple[tuple, int, int, _Group, SchedRequest]]] = {}
        self._timers: list[tuple[float, int, int, _Group]] = []  # (time, version, tick, group)
        self._len = 0
        self._tick = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[SchedRequest]:
        for g in self._groups.values():
            for _, r in g.aging:
                yield r
            for _, r in g.settled:
                yield r

    # ----------------------------------------------------------- mutation
    def push(self, r: SchedRequest, now: float | None = None) -> None:
        key = self._policy.group(r)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(key, r.cls.band)
            self._by_band.setdefault(g.band, {})[key] = g
        heapq.heappush(g.aging, (self._policy.heap_key(r), r))
        self._len += 1
        if g.aging[0][1] is r:
            self._refresh(g, r.wait_since if now is None else now)

    def pop_head(self, r: SchedRequest, now: float) -> None:
        """Remove `r`, which must be a head of its group (as `best` returns)."""
        g = self._groups[self._policy.group(r)]
        for heap in (g.settled, g.aging):
            if heap and heap[0][1] is r:
                heapq.heappop(heap)
                break
        else:
            raise ValueError(f"{r.id} is not at the head of its group")
        self._len -= 1
        self._refresh(g, now)

    def remove(self, r: SchedRequest, now: float) -> bool:
        """Remove `r` from anywhere in its group (cancellation): O(group size)."""
        g = self._groups.get(self._policy.group(r))
        if g is None:
            return False
        for heap in (g.aging, g.settled):
            for i, (_, other) in enumerate(heap):
                if other is r:
                    heap[i] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    self._len -= 1
                    self._refresh(g, now)
                    return True
        return False

    def _refresh(self, g: _Group, now: float) -> None:
        """Re-file a group whose head or head's age may have changed."""
        g.version += 1
        policy = self._policy
        settles_at = policy.settles_at
        while g.aging and settles_at(g.aging[0][1]) <= now:
            _, r = heapq.heappop(g.aging)
            heapq.heappush(g.settled, ((r.arrival, r.seq), r))
        if not g:
            del self._groups[g.key]
            del self._by_band[g.band][g.key]
            return
        static, head = self._group_head(g, now)
        part = self._parts.setdefault((policy.partition(head), g.band), [])
        self._tick += 1
        heapq.heappush(part, (static, g.version, self._tick, g, head))
        if g.aging:
            t = policy.next_change(g.aging[0][1], now)
            if t < INF:
                heapq.heappush(self._timers, (t, g.version, self._tick, g))

    def _advance(self, now: float) -> None:
        """Apply every aging change due by `now`."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, version, _, g = heapq.heappop(timers)
            if version == g.version and self._groups.get(g.key) is g:
                self._refresh(g, now)

    # ------------------------------------------------------------- queries
    def best(
        self, now: float, scores: Mapping[str, float], below_band: int | None = None
    ) -> tuple[tuple, SchedRequest] | None:
        """The best waiting request and its rank, or None when there is none;
        with `below_band`, the best of the classes better than that band."""
        self._advance(now)
        compose = self._policy.compose
        best: tuple[tuple, SchedRequest] | None = None
        for part_key, part in list(self._parts.items()):
            if below_band is not None and part_key[1] >= below_band:
                continue
            while part and not self._current(part[0]):
                heapq.heappop(part)
            if not part:
                del self._parts[part_key]
                continue
            static, _, _, _, head = part[0]  # current: aging changes were applied above
            rank = compose(static, scores.get(part_key[0], 0.0))
            if best is None or rank < best[0]:
                best = (rank, head)
        return best

    def best_in_band(
        self, now: float, scores: Mapping[str, float], band: int,
        eligible: Callable[[SchedRequest], bool],
    ) -> tuple[tuple, SchedRequest] | None:
        """The best waiter of class `band` that passes `eligible` (a test of
        what a group shares: level, priority). Scans that band's groups;
        serves time slicing only."""
        self._advance(now)
        rank = self._policy.rank
        best: tuple[tuple, SchedRequest] | None = None
        for g in self._by_band.get(band, {}).values():
            if not eligible((g.settled or g.aging)[0][1]):  # any member speaks for the group
                continue
            _, head = self._group_head(g, now)
            r_rank = rank(head, now, scores)
            if best is None or r_rank < best[0]:
                best = (r_rank, head)
        return best

    def _current(self, entry: tuple) -> bool:
        version, g = entry[1], entry[3]
        return version == g.version and self._groups.get(g.key) is g

    def _group_head(self, g: _Group, now: float) -> tuple[tuple, SchedRequest]:
        static_rank = self._policy.static_rank
        best = None
        for heap in (g.settled, g.aging):
            if heap:
                cand = heap[0][1]
                static = static_rank(cand, now)
                if best is None or static < best[0]:
                    best = (static, cand)
        return best

    def next_change(self, now: float) -> float:
        """Earliest time a group head's rank changes by aging (inf: never)."""
        self._advance(now)
        timers = self._timers
        while timers:
            _, version, _, g = timers[0]
            if version == g.version and self._groups.get(g.key) is g:
                return timers[0][0]
            heapq.heappop(timers)
        return INF
