"""What a replay reports: `fsched simulate`'s report, built by the same code from what the client measured.

Each completed request becomes the simulator's `Track`: it arrived when it
was sent, its first token and its end when they reached the client, its
output what the endpoint said it generated (its usage). `build_report`
then gives the same figures as a simulated run: per class, per tenant and
class, throughput, Jain's index.

Shares are the one thing the client cannot see as the simulator does: it
sees no engine time and no KV. A tenant's served share is here its tokens
served while every tenant had requests outstanding (sent, not finished),
over all tenants' tokens in that time; on an engine that gives each running
request one token an iteration (the paced engine; a decode-bound vLLM) that
is its share of the iterations. `token_shares` computes it from any run's
request records, so a simulated run can be read the same way.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from fsched.core.replay.driver import Observed
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sim.report import PolicyReport, RequestRecord, Track, UsageWindow, build_report


class Served(Protocol):
    """What `token_shares` reads of a request (the simulator's RequestRecord is one)."""

    tenant: str
    arrival_s: float
    first_token_s: float
    finish_s: float
    output_tokens: int


@dataclass(slots=True, frozen=True)
class Window:
    """A union of disjoint intervals, sorted, and the measure of its part before any time."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    before: tuple[float, ...]  # the window's seconds before each interval

    @classmethod
    def of(cls, intervals: Sequence[tuple[float, float]]) -> Window:
        before, total = [], 0.0
        for a, b in intervals:
            before.append(total)
            total += b - a
        return cls(tuple(a for a, _ in intervals), tuple(b for _, b in intervals), tuple(before))

    @property
    def seconds(self) -> float:
        return self.before[-1] + self.ends[-1] - self.starts[-1] if self.starts else 0.0

    def upto(self, t: float) -> float:
        """Seconds of the window before time t."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return 0.0
        return self.before[i] + min(t, self.ends[i]) - self.starts[i]

    def holds(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t < self.ends[i]


def all_outstanding(records: Iterable[Served], tenants: Iterable[str]) -> Window:
    """The times at which every one of `tenants` had a request outstanding (arrived, not finished)."""
    # At one instant a request's end comes before another's arrival.
    events = sorted((t, delta, r.tenant) for r in records
                    for t, delta in ((r.arrival_s, 1), (r.finish_s, -1)))
    wanted, open_by = set(tenants), Counter()
    intervals, start = [], None
    for t, delta, tenant in events:
        open_by[tenant] += delta
        busy = all(open_by[x] > 0 for x in wanted)
        if busy and start is None:
            start = t
        elif not busy and start is not None:
            if t > start:
                intervals.append((start, t))
            start = None
    return Window.of(intervals)


def token_shares(records: Sequence[Served], tenants: Sequence[str]) -> tuple[dict[str, float], float]:
    """Each tenant's tokens served while every tenant had work outstanding, over all tenants' then
    (a request's tokens spread evenly from its first to its last), and that window's seconds; over
    the whole run when there was no such time."""
    window = all_outstanding(records, tenants)
    if window.seconds <= 0:
        end = max((r.finish_s for r in records), default=0.0)
        window = Window.of([(0.0, end)] if end > 0 else [])
    served: dict[str, float] = defaultdict(float)
    for r in records:
        served[r.tenant] += _tokens_within(r, window)
    total = sum(served.values())
    return ({t: served.get(t, 0.0) / total for t in tenants} if total > 0 else {}), window.seconds


def _tokens_within(r: Served, window: Window) -> float:
    first = 1.0 if window.holds(r.first_token_s) else 0.0
    rest = r.output_tokens - 1
    if rest <= 0 or r.finish_s <= r.first_token_s:
        return first + max(rest, 0) * first
    inside = window.upto(r.finish_s) - window.upto(r.first_token_s)
    return first + rest * inside / (r.finish_s - r.first_token_s)


@dataclass(slots=True)
class LiveRun:
    """A replay's report and what only a live run has: what failed, how prompts were sized."""

    report: PolicyReport
    url: str
    model: str
    prompt_sizing: str
    forcing: str
    sent: int = 0
    completed: int = 0
    refused: int = 0  # HTTP 400: the endpoint would not take the request (too long for its context)
    failed: int = 0  # any other error: connection, status, a stream cut short
    errors: dict[str, int] = field(default_factory=dict)  # a few messages, each with its count
    short_outputs: int = 0  # completed with fewer tokens than the trace asked
    prompt_error: float | None = None  # mean |endpoint's prompt tokens - trace's| / trace's
    send_lag_max_s: float = 0.0  # how late the client sent its latest request
    share_window_s: float = 0.0  # the time every tenant had requests outstanding

    def to_json(self) -> dict:
        own = {k: getattr(self, k) for k in self.__slots__ if k != "report"}
        return {**own, "report": self.report.to_json()}


def live_report(label: str, observed: Sequence[Observed], weights: Mapping[str, float], *, url: str,
                model: str, prompt_sizing: str, forcing: str,
                config: SchedulerConfig | None = None) -> LiveRun:
    """The report of a replay, in the simulator's terms (class targets from `config`)."""
    config = config or SchedulerConfig()
    done = [o for o in observed if o.completed]
    tracks = {str(o.send.index): _track(o) for o in done}
    tenants = sorted({o.send.request.tenant for o in observed})
    weights = {t: weights.get(t, config.default_weight) for t in {*weights, *tenants}}
    shares, window_s = token_shares([_track_record(t) for t in tracks.values()], tenants)
    usage = UsageWindow(seconds=window_s)
    usage.gpu_s.update({t: share * window_s for t, share in shares.items()})
    makespan = max((o.finish_s for o in done), default=0.0)
    report = build_report(label, tracks, tenants, weights, usage, config, makespan)
    report.rejected = sum(o.status == 400 for o in observed)
    run = LiveRun(report, url, model, prompt_sizing, forcing, sent=len(observed), completed=len(done),
                  refused=report.rejected, share_window_s=window_s)
    run.failed = run.sent - run.completed - run.refused
    run.errors = dict(Counter(o.error[:160] for o in observed if o.error is not None).most_common(5))
    run.short_outputs = sum(o.output_tokens < o.send.request.output_tokens for o in done)
    errors = [abs(o.prompt_tokens - o.send.request.prompt_tokens) / o.send.request.prompt_tokens
              for o in done if isinstance(o.prompt_tokens, int)]
    run.prompt_error = sum(errors) / len(errors) if errors else None
    run.send_lag_max_s = max((o.sent_s - o.send.at_s for o in observed), default=0.0)
    return run


def observed_json(o: Observed) -> dict:
    """One request as the client measured it (times in seconds after the replay started)."""
    r = o.send.request
    return {"index": o.send.index, "tenant": r.tenant, "class": r.request_class.value, "at_s": o.send.at_s,
            "sent_s": o.sent_s, "first_token_s": o.first_token_s, "finish_s": o.finish_s,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "endpoint_prompt_tokens": o.prompt_tokens, "endpoint_output_tokens": o.output_tokens,
            "status": o.status, "error": o.error}


def _track(o: Observed) -> Track:
    req = replace(o.send.request, arrival_s=o.sent_s, output_tokens=max(1, o.output_tokens))
    return Track(req, first_token_s=o.first_token_s, finish_s=o.finish_s, wait_start=o.sent_s,
                 max_wait_s=o.first_token_s - o.sent_s)


def _track_record(tr: Track) -> RequestRecord:
    r = tr.req
    return RequestRecord(r.tenant, r.request_class, r.arrival_s, tr.first_token_s, tr.finish_s,
                         r.output_tokens, tr.max_wait_s)
