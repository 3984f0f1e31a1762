"""The order inside one group of waiting requests (a tenant's class at one base priority), and the
heaps that keep it.

Two orders, each a total order key (smaller first) that a policy puts at the end of its rank:

* **By arrival** (`arrival_key`, `ArrivalLine`): the oldest first. The baselines' order.
* **By deadline** (`deadline_key`, `DeadlineLine`): fsched's, for every class, since a request
  counts only if its first token comes within its class's target. Three bands:

  0. **first**: a request that already has its first token (preempted, waiting to resume), or one
     that has waited its class's aging limit (`SchedulerConfig.aging_factor` x its target); by
     arrival. This band bounds every wait: see `docs/scheduling.md` (the order inside a class).
  1. **on time**: it can still make its target. Realtime and streaming: the fewest prefill steps
     first (shortest remaining prefill, SRTF, counted in steps of `step_tokens`, the unit the
     engine spends), then the nearest deadline (EDF). With `shortest_first` off (batch, whose
     minute a prefill hardly dents): by deadline alone, which inside a class is arrival order.
  2. **late**: its target is out of reach (`late_at`, set when it starts waiting: its deadline less
     the time its prefill takes at the measured step time); by arrival, behind every on-time one,
     until it ages into band 0.

  A request moves from band 1 to band 2 (at `late_at`) and from 2 to 0 (at its aging limit) as time
  passes, never back while it waits, so each band is a heap in its own order and a line's best
  member is the best of three heap tops. A request's move is found lazily, by a heap of the
  on-time requests keyed by `late_at`.

The deadline fields are set by `stamp` when a request starts waiting (arrival or preemption).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Protocol

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import Request

FIRST, ON_TIME, LATE = 0, 1, 2


def stamp(r: Request, config: SchedulerConfig, step_s: float) -> None:
    """Set `r`'s deadline, the time its target goes out of reach and the time it ages, for a
    wait that starts now; `step_s` is the measured time of an engine step with prefill (0 when
    none has run yet: a request is then late only past its deadline)."""
    target = config.target_s(r.request_class)
    r.deadline = r.arrival + target
    r.late_at = r.deadline - prefill_steps(r, config) * step_s
    r.aged_at = r.arrival + config.aging_factor * target


def restamp_running(running: Iterable[Request], config: SchedulerConfig, step_s: float) -> None:
    """Move the `late_at` of each running request still before its first token to what the prefill
    it has left takes (as `stamp` does for the whole prompt when a wait starts), so that `on_target`
    follows its progress."""
    for r in running:
        if r.generated == 0 and r.pending_prefill:
            r.late_at = r.deadline - prefill_steps(r, config) * step_s


def prefill_steps(r: Request, config: SchedulerConfig) -> int:
    """Engine steps `r`'s prefill takes at the most one step holds."""
    return math.ceil(r.pending_prefill / config.step_tokens)


def arrival_key(r: Request) -> tuple:
    return (r.arrival, r.seq)


def band(r: Request, now: float) -> int:
    """FIRST, ON_TIME or LATE, as of `now`."""
    if r.generated > 0 or now >= r.aged_at:
        return FIRST
    return ON_TIME if now < r.late_at else LATE


def on_target(r: Request, now: float) -> bool:
    """Whether `r`'s first token can still come within its target, as of `now` (not yet out, and
    its prefill not yet out of reach): aging aside, what band ON_TIME says of a waiting request."""
    return r.generated == 0 and now < r.late_at


def deadline_key(r: Request, now: float, config: SchedulerConfig,
                 shortest_first: bool = True) -> tuple:
    """The order by deadline (smaller first), as of `now`."""
    b = band(r, now)
    if b == ON_TIME:
        return _on_time_key(r, config, shortest_first)
    return (b, r.arrival, r.seq)


def _on_time_key(r: Request, config: SchedulerConfig, shortest_first: bool) -> tuple:
    return (ON_TIME, prefill_steps(r, config) if shortest_first else 0, r.deadline, r.seq)


class Line(Protocol):
    """The waiting members of one group, in the group's order.

    `head(now)` is the best member at `now` (None when empty); `first(k, now)` the k best, best
    first; `pop(r)` removes `r` from anywhere (O(log n) amortised)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...
    def push(self, r: Request, now: float) -> None: ...
    def pop(self, r: Request) -> bool: ...
    def head(self, now: float) -> Request | None: ...
    def first(self, k: int, now: float) -> list[Request]: ...


class _Heap:
    """A heap of (key, tick, request) with lazy removal: an entry counts while `live` holds its
    request's id with the entry's tick (each push has its own tick, so an entry left behind by a
    request that was removed and pushed again never counts twice)."""

    __slots__ = ("items", "live", "ticks")

    def __init__(self, live: dict[str, int], ticks: itertools.count) -> None:
        self.items: list[tuple[tuple, int, Request]] = []
        self.live = live
        self.ticks = ticks

    def push(self, key: tuple, r: Request) -> None:
        tick = next(self.ticks)
        heapq.heappush(self.items, (key, tick, r))
        self.live[r.id] = tick

    def members(self) -> Iterator[Request]:
        return (r for _, tick, r in self.items if self.live.get(r.id) == tick)

    def top(self) -> Request | None:
        items = self.items
        while items and self.live.get(items[0][2].id) != items[0][1]:
            heapq.heappop(items)
        return items[0][2] if items else None

    def smallest(self, k: int) -> Iterator[Request]:
        """Its k best live members, best first: a best-first walk down the heap's tree, after dropping
        the removed entries at its root (else every walk would step over them again)."""
        self.top()
        items = self.items
        frontier = [(items[0][:2], 0)] if items else []
        while frontier and k > 0:
            _, i = heapq.heappop(frontier)
            _, tick, r = items[i]
            if self.live.get(r.id) == tick:
                k -= 1
                yield r
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(items):
                    heapq.heappush(frontier, (items[child][:2], child))


class ArrivalLine:
    """Oldest first."""

    __slots__ = ("_live", "_heap")

    def __init__(self) -> None:
        self._live: dict[str, int] = {}
        self._heap = _Heap(self._live, itertools.count())

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        return self._heap.members()

    def push(self, r: Request, now: float) -> None:
        self._heap.push(arrival_key(r), r)

    def pop(self, r: Request) -> bool:
        return self._live.pop(r.id, None) is not None

    def head(self, now: float) -> Request | None:
        return self._heap.top()

    def first(self, k: int, now: float) -> list[Request]:
        return list(self._heap.smallest(k))


class DeadlineLine:
    """`deadline_key`'s order (see the module's docstring)."""

    __slots__ = ("_config", "_shortest_first", "_live", "_first", "_on_time", "_late", "_watch")

    def __init__(self, config: SchedulerConfig, shortest_first: bool = True) -> None:
        self._config = config
        self._shortest_first = shortest_first
        self._live: dict[str, int] = {}
        ticks = itertools.count()
        self._first = _Heap(self._live, ticks)  # started: by arrival
        self._on_time = _Heap(self._live, ticks)  # by (prefill steps, deadline)
        self._late = _Heap(self._live, ticks)  # late or aged: by arrival (the aged ones are its oldest)
        self._watch: list[tuple[float, int, int, Request]] = []  # on-time members by late_at

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        for h in (self._first, self._on_time, self._late):
            yield from h.members()

    def push(self, r: Request, now: float) -> None:
        if r.generated > 0:
            self._first.push(arrival_key(r), r)
        elif now < r.late_at and now < r.aged_at:
            self._on_time.push(_on_time_key(r, self._config, self._shortest_first), r)
            heapq.heappush(self._watch, (r.late_at, r.seq, self._live[r.id], r))
        else:
            self._late.push(arrival_key(r), r)

    def pop(self, r: Request) -> bool:
        return self._live.pop(r.id, None) is not None

    def _move_late(self, now: float) -> None:
        """Move every on-time member whose target went out of reach by `now` to the late heap."""
        watch = self._watch
        while watch and watch[0][0] <= now:
            _, _, tick, r = heapq.heappop(watch)
            if self._live.get(r.id) == tick:  # still waiting, on time until now
                self._late.push(arrival_key(r), r)

    def head(self, now: float) -> Request | None:
        """`first(1, now)`'s one, from the three heaps' tops (the scheduler asks at every admission: no
        walk and no merge of lists)."""
        self._move_late(now)
        config, shortest = self._config, self._shortest_first
        best, best_key = None, None
        for h in (self._first, self._on_time, self._late):
            r = h.top()
            if r is not None:
                key = deadline_key(r, now, config, shortest)
                if best is None or key < best_key:
                    best, best_key = r, key
        return best

    def first(self, k: int, now: float) -> list[Request]:
        self._move_late(now)
        heads = [r for h in (self._first, self._on_time, self._late) for r in h.smallest(k)]
        config, shortest = self._config, self._shortest_first
        return heapq.nsmallest(k, heads, key=lambda r: deadline_key(r, now, config, shortest))
