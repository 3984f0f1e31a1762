"""Waiting requests: heaps whose order stays valid while tenant standings move.

Two layers:

* **Groups** (`policy.group`): requests that share every part of the rank
  but its last, the order inside the group (`policy.line`, lines.py: by
  arrival, or by deadline for realtime and streaming work). A line's head
  is its best member at any time (a preempted request keeps its arrival and
  so its place in line). A line's order may move with time (a request
  going late), so the part of the rank it gives must come after every part
  that tells two groups of one partition apart.
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

from fsched.core.sched.lines import Line
from fsched.core.sched.policy import Policy, Standing
from fsched.core.sched.request import Request

_NEUTRAL = Standing()


class _Group:
    __slots__ = ("key", "band", "line", "head", "version")

    def __init__(self, key: Hashable, band: int, line: Line) -> None:
        self.key = key
        self.band = band  # class band shared by the members
        self.line = line
        self.head: Request | None = None  # the best member when last filed
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
            yield from g.line

    # ----------------------------------------------------------- mutation
    def push(self, r: Request, now: float) -> None:
        key = self._policy.group(r)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(key, r.request_class.band, self._policy.line(r))
        g.line.push(r, now)
        self._len += 1
        self._refile(g, now)

    def pop_head(self, r: Request, now: float) -> None:
        """Remove `r`, which must be the head of its group (as `best` returns)."""
        g = self._groups[self._policy.group(r)]
        if g.line.head(now) is not r:
            raise ValueError(f"{r.id} is not at the head of its group")
        self.remove(r, now)

    def take(self, r: Request, now: float) -> None:
        """Remove `r`, wherever it is in its group."""
        if not self.remove(r, now):
            raise ValueError(f"{r.id} is not waiting")

    def remove(self, r: Request, now: float) -> bool:
        """Remove `r` from anywhere in its group (cancellation, admission)."""
        g = self._groups.get(self._policy.group(r))
        if g is None or not g.line.pop(r):
            return False
        self._len -= 1
        self._refile(g, now)
        return True

    def _refile(self, g: _Group, now: float) -> None:
        """Re-file a group whose head may have changed."""
        head = g.line.head(now)
        if head is g.head and head is not None:
            return
        g.version += 1
        g.head = head
        if head is None:
            del self._groups[g.key]
            return
        policy = self._policy
        part = self._parts.setdefault((policy.partition(head), g.band), [])
        self._tick += 1
        heapq.heappush(part, (policy.static_rank(head, now), g.version, self._tick, g, head))

    def _current(self, version: int, g: _Group) -> bool:
        return version == g.version and self._groups.get(g.key) is g

    # ------------------------------------------------------------- queries
    def one_standing(self) -> bool:
        """Whether every waiting request's rank reads one standing (its partitions share their tenant):
        `best` then picks the same under any standing of it."""
        parts = iter(self._parts)
        first = next(parts, None)
        return first is None or all(key[0] == first[0] for key in parts)

    def best(self, now: float, stand: Mapping[str, Standing]) -> tuple[tuple, Request] | None:
        """The best waiting request and its rank, or None when there is none."""
        compose, static_rank = self._policy.compose, self._policy.static_rank
        best: tuple[tuple, Request] | None = None
        for part_key, part in list(self._parts.items()):
            head = self._top(part, now)
            if head is None:
                del self._parts[part_key]
                continue
            rank = compose(static_rank(head, now), stand.get(part_key[0], _NEUTRAL))
            if best is None or rank < best[0]:
                best = (rank, head)
        return best

    def _top(self, part: list, now: float) -> Request | None:
        """The best head of a partition's heap at `now`: stale entries dropped, a group whose
        best member changed with time (lines.py: a request late, or aged) re-filed."""
        while part:
            _, version, _, g, head = part[0]
            if not self._current(version, g):
                heapq.heappop(part)
            elif g.line.head(now) is not head:
                self._refile(g, now)
            else:
                return head
        return None

    def ranked(self, now: float, stand: Mapping[str, Standing], limit: int) -> list[Request]:
        """The first `limit` waiting requests in rank order: the `limit` best of
        each group, ranked with their tenant's standing."""
        best = [r for g in self._groups.values() for r in g.line.first(limit, now)]
        return heapq.nsmallest(limit, best, key=lambda r: self._policy.rank(r, now, stand))
