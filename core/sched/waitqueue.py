"""Waiting requests: heaps whose order stays valid while tenant standings move.

Two layers:

* **Groups** (`policy.group`): requests that share every part of the rank
  except their arrival. Each group is a heap in arrival order, so its head
  is its best member at any time (a preempted request keeps its arrival and
  so its place in line).
* **Partitions** (`policy.partition` (the tenant), class band): a heap of
  group heads keyed by the score-free `static_rank`. Within a partition
  every request has the same tenant standing, so this order is the rank
  order.

A pick composes each partition's top with its tenant's standing and takes
the best: O(partitions) plus O(log n) heap work. Entries are invalidated
lazily by a per-group version number.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Mapping

from fsched.core.sched.policy import Policy, Standing
from fsched.core.sched.request import Request

_Entry = tuple[tuple, Request]
_NEUTRAL = Standing()


class _Group:
    __slots__ = ("key", "band", "heap", "version")

    def __init__(self, key: Hashable, band: int) -> None:
        self.key = key
        self.band = band  # class band shared by the members
        self.heap: list[_Entry] = []
        self.version = 0


class WaitQueue:
    __slots__ = ("_policy", "_groups", "_parts", "_len", "_tick")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._groups: dict[Hashable, _Group] = {}
        # (tenant, band) -> heap of (static rank, version, tick, group, head);
        # the tick is unique, so entries never compare further
        self._parts: dict[tuple[str, int], list[tuple[tuple, int, int, _Group, Request]]] = {}
        self._len = 0
        self._tick = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        for g in self._groups.values():
            for _, r in g.heap:
                yield r

    # ----------------------------------------------------------- mutation
    def push(self, r: Request, now: float) -> None:
        key = self._policy.group(r)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(key, r.request_class.band)
        heapq.heappush(g.heap, ((r.arrival, r.seq), r))
        self._len += 1
        if g.heap[0][1] is r:
            self._refresh(g, now)

    def pop_head(self, r: Request, now: float) -> None:
        """Remove `r`, which must be the head of its group (as `best` returns)."""
        g = self._groups[self._policy.group(r)]
        if g.heap[0][1] is not r:
            raise ValueError(f"{r.id} is not at the head of its group")
        heapq.heappop(g.heap)
        self._len -= 1
        self._refresh(g, now)

    def take(self, r: Request, now: float) -> None:
        """Remove `r`, wherever it is in its group (the head: O(log n))."""
        g = self._groups[self._policy.group(r)]
        if g.heap[0][1] is r:
            self.pop_head(r, now)
        elif not self.remove(r, now):
            raise ValueError(f"{r.id} is not waiting")

    def remove(self, r: Request, now: float) -> bool:
        """Remove `r` from anywhere in its group (cancellation): O(group size)."""
        g = self._groups.get(self._policy.group(r))
        if g is None:
            return False
        for i, (_, other) in enumerate(g.heap):
            if other is r:
                g.heap[i] = g.heap[-1]
                g.heap.pop()
                heapq.heapify(g.heap)
                self._len -= 1
                self._refresh(g, now)
                return True
        return False

    def _refresh(self, g: _Group, now: float) -> None:
        """Re-file a group whose head may have changed."""
        g.version += 1
        if not g.heap:
            del self._groups[g.key]
            return
        policy = self._policy
        head = g.heap[0][1]
        part = self._parts.setdefault((policy.partition(head), g.band), [])
        self._tick += 1
        heapq.heappush(part, (policy.static_rank(head, now), g.version, self._tick, g, head))

    def _current(self, version: int, g: _Group) -> bool:
        return version == g.version and self._groups.get(g.key) is g

    # ------------------------------------------------------------- queries
    def best(self, now: float, stand: Mapping[str, Standing]) -> tuple[tuple, Request] | None:
        """The best waiting request and its rank, or None when there is none."""
        compose = self._policy.compose
        best: tuple[tuple, Request] | None = None
        for part_key, part in list(self._parts.items()):
            while part and not self._current(part[0][1], part[0][3]):
                heapq.heappop(part)
            if not part:
                del self._parts[part_key]
                continue
            static, _, _, _, head = part[0]
            rank = compose(static, stand.get(part_key[0], _NEUTRAL))
            if best is None or rank < best[0]:
                best = (rank, head)
        return best

    def ranked(self, now: float, stand: Mapping[str, Standing], limit: int) -> list[Request]:
        """The first `limit` waiting requests in rank order: the `limit` oldest of
        each group, ranked with their tenant's standing."""
        oldest = [r for g in self._groups.values() for r in _oldest(g.heap, limit)]
        return heapq.nsmallest(limit, oldest, key=lambda r: self._policy.rank(r, now, stand))


def _oldest(heap: list[_Entry], k: int) -> Iterator[Request]:
    """The k smallest entries of a heap, smallest first, in O(k log k): a
    best-first walk down the heap's tree, whose children never precede
    their parent."""
    if not heap:
        return
    frontier = [(heap[0][0], 0)]
    for _ in range(k):
        if not frontier:
            return
        _, i = heapq.heappop(frontier)
        yield heap[i][1]
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child][0], child))
