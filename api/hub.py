"""One hub per server process: every open request's progress, from the table and from the daemons' links.

Handlers do not poll the table themselves: each registers its job and waits
on an event. Two sources wake it:
- the table: the hub reads all registered jobs at once every `interval_s`
  (200 open streams cost one query a tick, not 200);
- a daemon's link (api/link.py): the daemon pushes each step's text of a
  request it holds; such a job is then read from the table only every
  `linked_poll_s` once it has waited that long since it was linked (a
  check: cancels and failures reach the table first; most are pushed
  before), and once its daemon has pushed it only every `pushed_poll_s` (a
  daemon that pushes a request pushes its end too, cancels and failures
  included: the check is then a net for a daemon that stops pushing and
  keeps its link); then its states alone (no text, no token ids), read in
  full only when the table shows it ended or ahead of the pushes.

What a handler sees never goes back: a read that shows less than a push
already did is ignored until the table catches up, unless it ends the request.

A push of a running request whose handler waits with nothing in hand goes to
the handler's sink, if it set one (`attach`): the sink writes the new text to
the client from the push itself, and no task wakes for the token. A link's
push of a one-request job's running text (`push_running`) goes to the
handler's text sink as the text itself: the request's progress is made only
if something reads it later (the handler woken, a table check), not at
every token.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from fsched.core.ports.records import RequestProgress
from fsched.core.types import RequestStatus

# A job's requests, one a choice, in choice order.
Choices = tuple[RequestProgress, ...]
Reader = Callable[[Sequence[int]], dict[int, Choices]]
# Job ids -> each one's requests as (status, output tokens), in choice order.
StatesReader = Callable[[Sequence[int]], dict[int, tuple[tuple[RequestStatus, int], ...]]]

LINKED_POLL_S = 0.25  # a linked job's table check: cancels, failures and the record
# The same check of a linked job its daemon has pushed (its end comes over the link): measured, four times
# a second for 32 streams was about a quarter of a server's CPU while they waited for tokens.
PUSHED_POLL_S = 1.0
_FINISHED = RequestStatus.FINISHED_STOPPED  # this and above: finished


@dataclass(slots=True)
class _Watch:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: Choices = ()
    linked_at: float | None = None  # the last push of a daemon's link (monotonic)
    pushed: bool = False  # a daemon's link pushed it since it was (re)linked
    ticked: bool = False  # a tick of `follow` came since the last wake-up
    # Set by the handler while it waits with nothing in hand: takes a push's running progress and
    # writes it to the client itself (True), or declines it (False: the handler is woken instead).
    sink: Callable[[Choices], bool] | None = None
    waiting: bool = False  # `follow` waits on `event`: the handler holds no update
    # Set with `sink`, for a job of one request: takes a push's running text (the request's whole output
    # so far) the same way, with no progress made of it.
    text_sink: Callable[[str], bool] | None = None
    delivered: Choices | None = None  # the last progress a sink took
    delivered_at: float = -1e18  # when (monotonic)
    # A push a text sink took, its progress not made yet: (make, source, text); `_latest` makes it.
    unmade: tuple[Callable[[Any, str], Choices], Any, str] | None = None
    # Asked at each tick (with the monotonic time) whether the tick wakes the handler; None: every tick.
    due: Callable[[float], bool] | None = None


def _latest(watch: _Watch) -> Choices:
    """The watch's latest progress, made now of a text sink's push if it was not yet (a push's progress is
    made only when something reads it: most are written by the sink and read by nobody)."""
    if watch.unmade is not None:
        make, source, text = watch.unmade
        watch.unmade = None
        watch.latest = watch.delivered = make(source, text)
    return watch.latest


def _shown(watch: _Watch) -> int | None:
    """How many characters the watch's latest progress shows; None when a request of it ended."""
    if watch.unmade is not None:
        return len(watch.unmade[2])
    shown = 0
    for p in watch.latest:
        if p.status >= _FINISHED:
            return None
        shown += len(p.output_text)
    return shown


def _ahead(new: Choices, old: Choices) -> bool:
    """Whether `new` shows at least what `old` did (or ends the request). Called at every push: plain
    loops, no generator a call."""
    if not old:
        return True
    shown = 0
    for p in new:
        if p.status >= _FINISHED:
            return True
        shown += len(p.output_text)
    for p in old:
        if p.status >= _FINISHED:
            return False
        shown -= len(p.output_text)
    return shown >= 0


class ProgressHub:
    def __init__(self, read: Reader, interval_s: float = 0.005, linked_poll_s: float = LINKED_POLL_S,
                 read_states: StatesReader | None = None, pushed_poll_s: float = PUSHED_POLL_S):
        self.read = read
        self.read_states = read_states  # None: linked jobs are checked by full reads too
        self.interval_s = interval_s
        self.linked_poll_s = linked_poll_s
        self.pushed_poll_s = max(pushed_poll_s, linked_poll_s)
        self.closing = False
        self.on_close: Callable[[int], None] | None = None  # told when a job's last watcher leaves
        self._watches: dict[int, _Watch] = {}
        self._expected: dict[int, bool] = {}  # announced on a link before anyone watched
        self._wake = asyncio.Event()
        self._linked_polled_at = -1e18
        self._pushed_polled_at = -1e18
        self._ticking: dict[float, dict[int, _Watch]] = {}  # tick_s -> the watches ticked that often
        self._timers: dict[float, asyncio.TimerHandle] = {}  # tick_s -> the timer that ticks them

    async def watch(self, job_id: int) -> AsyncIterator[Choices]:
        """Each change of the job's requests (its choices), until every one has ended (the last
        yielded is final)."""
        async for choices in self.follow(job_id, tick_s=None):
            if choices is not None:
                yield choices

    async def follow(self, job_id: int, tick_s: float | None,
                     due: Callable[[float], bool] | None = None) -> AsyncIterator[Choices | None]:
        """As `watch`, and None at a tick (every `tick_s`) that brings no change (the handler's moment
        to send a keep-alive or give up), and at once when the server starts closing. `due`, asked at
        each tick, says whether it wakes the handler (a stream whose rules have nothing to check then
        sleeps through it)."""
        watch = self._watches[job_id] = _Watch(due=due)
        if self._expected.pop(job_id, False):
            watch.linked_at = time.monotonic()  # announced on a link: its daemon will push
        self._wake.set()
        if tick_s is not None:
            self._tick_with(job_id, watch, tick_s)
        seen = None
        try:
            while True:
                watch.waiting = True
                try:
                    await watch.event.wait()
                finally:
                    watch.waiting = False
                watch.event.clear()
                ticked, watch.ticked = watch.ticked, False
                if self.closing:
                    yield None
                    continue
                choices = _latest(watch)
                if choices is watch.delivered:  # a sink has written it already
                    if ticked:
                        yield None
                    continue
                key = tuple((p.status, p.num_output_tokens, len(p.output_text)) for p in choices)
                if key != seen:
                    seen = key
                    yield choices
                elif ticked:
                    yield None
                if choices and all(p.status.is_finished for p in choices):
                    return
        finally:
            if tick_s is not None:
                self._untick(job_id, watch, tick_s)
            self._watches.pop(job_id, None)
            if self.on_close is not None:
                self.on_close(job_id)

    def _tick_with(self, job_id: int, watch: _Watch, tick_s: float) -> None:
        """Tick the watch every `tick_s` with the others of that period: one timer for all of them, not
        one a stream (each re-armed at every tick)."""
        group = self._ticking.get(tick_s)
        if group is None:
            group = self._ticking[tick_s] = {}
            self._timers[tick_s] = asyncio.get_running_loop().call_later(tick_s, self._tick, tick_s)
        group[job_id] = watch

    def _untick(self, job_id: int, watch: _Watch, tick_s: float) -> None:
        group = self._ticking.get(tick_s, {})
        if group.get(job_id) is watch:
            del group[job_id]
        if not group and tick_s in self._ticking:  # nobody left: the timer stops with the last one
            del self._ticking[tick_s]
            self._timers.pop(tick_s).cancel()

    def _tick(self, tick_s: float) -> None:
        self._timers[tick_s] = asyncio.get_running_loop().call_later(tick_s, self._tick, tick_s)
        self._ring(self._ticking[tick_s].values())

    @staticmethod
    def _ring(watches) -> None:
        now = time.monotonic()
        for watch in watches:
            if watch.due is None or watch.due(now):
                watch.ticked = True
                watch.event.set()

    def tick_now(self) -> None:
        """A tick now, for every ticked watch whose `due` says so (a rule's state changed for many
        streams at once: a key found revoked)."""
        for group in list(self._ticking.values()):
            self._ring(list(group.values()))

    def push(self, job_id: int, choices: Choices) -> bool:
        """A daemon's link pushed the job's progress; False when nobody here watches it."""
        watch = self._watches.get(job_id)
        if watch is None:
            return False
        watch.linked_at = now = time.monotonic()
        watch.pushed = True
        if not _ahead(choices, _latest(watch)):
            return True
        watch.latest = choices
        if (watch.sink is not None and watch.waiting and not watch.event.is_set() and not self.closing
                and len(choices) == 1 and choices[0].status < _FINISHED
                and self._sunk(watch, watch.sink, choices)):
            watch.delivered, watch.delivered_at = choices, now
            return True
        watch.event.set()
        return True

    def push_running(self, job_id: int, text: str, make: Callable[[Any, str], Choices], source: Any) -> bool:
        """A daemon's link pushed the running text of the job's one request (its whole output so far):
        `push` of `make(source, text)`, made only when something here reads it. A text sink that takes
        the text (the handler waits with nothing in hand) needs no progress: none is made then."""
        watch = self._watches.get(job_id)
        if watch is None:
            return False
        if watch.text_sink is None or not watch.waiting or watch.event.is_set() or self.closing:
            return self.push(job_id, make(source, text))
        watch.linked_at = now = time.monotonic()
        watch.pushed = True
        shown = _shown(watch)
        if shown is None or len(text) < shown:  # behind what the handler has, or after its end: ignored
            return True
        if not self._sunk(watch, watch.text_sink, text):
            return self.push(job_id, make(source, text))
        watch.unmade = (make, source, text)
        watch.delivered_at = now
        return True

    @staticmethod
    def _sunk(watch: _Watch, sink: Callable[[Any], bool], pushed: Any) -> bool:
        """Whether the watch's `sink` (or text sink) took the push. A sink that fails is dropped with the
        other (its handler, woken, meets the failure itself): it runs inside a link's reader, which serves
        every stream."""
        try:
            return sink(pushed)
        except Exception:  # noqa: BLE001 - the handler's own path reports it
            watch.sink = watch.text_sink = None
            return False

    def attach(self, job_id: int, sink: Callable[[Choices], bool],
               text_sink: Callable[[str], bool] | None = None) -> bool:
        """Give pushes of the job's running progress to `sink` while its handler waits (see the module's
        note), and running texts (`push_running`) to `text_sink`; False when nobody follows the job yet."""
        watch = self._watches.get(job_id)
        if watch is None:
            return False
        watch.sink = sink
        watch.text_sink = text_sink
        return True

    def delivered_at(self, job_id: int) -> float:
        """When a sink last took the job's progress (monotonic; far past if never)."""
        watch = self._watches.get(job_id)
        return watch.delivered_at if watch is not None else -1e18

    def expect_push(self, job_id: int) -> None:
        """The job was announced on a live link: read it from the table only every `linked_poll_s`
        from the start (the link's drop reverts that)."""
        self._expected[job_id] = True

    def unexpect(self, job_id: int) -> None:
        """The job's handler is done with it, maybe before it ever watched (it went away right after
        the announcement)."""
        self._expected.pop(job_id, None)

    def unlink(self, job_ids: Sequence[int]) -> None:
        """A link went down: read these jobs from the table at every tick again."""
        for job_id in job_ids:
            if (watch := self._watches.get(job_id)) is not None:
                watch.linked_at = None
                watch.pushed = False
        self._wake.set()

    def close(self) -> None:
        """The server is stopping: wake every handler (each sees `closing`)."""
        self.closing = True
        for watch in self._watches.values():
            watch.event.set()

    def latest(self, job_id: int) -> Choices:
        watch = self._watches.get(job_id)
        return _latest(watch) if watch is not None else ()

    @staticmethod
    def _offer(watch: _Watch, choices: Choices) -> None:
        if _ahead(choices, _latest(watch)):
            watch.latest = choices
            watch.event.set()

    def _due(self, now: float) -> tuple[list[int], list[int]]:
        """The jobs to read this tick: unlinked ones always, linked ones not pushed yet together every
        `linked_poll_s` (those linked at least that long: most are pushed before, and need no read),
        and pushed ones every `pushed_poll_s` (with the others then: one read for all, not one a tick
        for whichever is due)."""
        pushed_due = now - self._pushed_polled_at >= self.pushed_poll_s
        linked_due = pushed_due or now - self._linked_polled_at >= self.linked_poll_s
        if linked_due:
            self._linked_polled_at = now
        if pushed_due:
            self._pushed_polled_at = now
        unlinked, linked = [], []
        waited = now - self.linked_poll_s  # a job not pushed yet is checked once linked this long ago
        for job_id, watch in self._watches.items():
            if watch.linked_at is None:
                unlinked.append(job_id)
            elif pushed_due if watch.pushed else linked_due and watch.linked_at <= waited:
                linked.append(job_id)
        return unlinked, linked

    def _behind(self, job_id: int, states: tuple[tuple[RequestStatus, int], ...]) -> bool:
        """Whether the table shows a linked job ended, or further than its pushes did: then it is read
        in full (a running request the link is ahead on needs nothing from the table)."""
        watch = self._watches.get(job_id)
        if watch is None:
            return False
        latest = _latest(watch)
        if len(states) != len(latest):
            return True
        return any(status >= _FINISHED or tokens > p.num_output_tokens
                   for (status, tokens), p in zip(states, latest, strict=True))

    async def _read(self, unlinked: list[int], linked: list[int]) -> dict[int, Choices]:
        """The jobs' progress from the table: the linked ones' states first, where the store reads them."""
        if linked and self.read_states is not None:
            states = await anyio.to_thread.run_sync(self.read_states, linked)
            linked = [job_id for job_id, s in states.items() if self._behind(job_id, s)]
        ids = unlinked + linked
        return await anyio.to_thread.run_sync(self.read, ids) if ids else {}

    def _pause(self, now: float) -> float:
        """How long the poll sleeps: a tick while any watched job is read from the table alone, else
        until the linked ones' next check (a new watch or a dropped link wakes it sooner). A tick's
        pass over every watch, 200 times a second, was most of an idle stream's cost."""
        due = self._pushed_polled_at + self.pushed_poll_s
        for watch in self._watches.values():
            if watch.linked_at is None:
                return self.interval_s
            if not watch.pushed:
                due = min(due, self._linked_polled_at + self.linked_poll_s)
        return max(self.interval_s, due - now)

    async def run(self) -> None:
        """Poll while anyone watches; sleep otherwise. Runs for the server's life."""
        while True:
            if not self._watches:
                self._wake.clear()
                await self._wake.wait()
            self._wake.clear()  # a watch added or unlinked from here on wakes the pause below
            unlinked, linked = self._due(time.monotonic())
            try:
                found = await self._read(unlinked, linked)
            except Exception:  # noqa: BLE001 - a failed read (database busy, gone) is retried next tick
                found = {}
            for job_id, progress in found.items():
                watch = self._watches.get(job_id)
                if watch is not None:
                    self._offer(watch, progress)
            pause = self._pause(time.monotonic())
            if pause <= self.interval_s:
                await asyncio.sleep(pause)
            elif not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
