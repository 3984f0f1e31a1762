"""An engine's absences, for a runner that keeps its requests while the engine is gone: when it went,
and when to ask it again (a backoff doubling up to a bound). The clock is the caller's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Outage:
    backoff_s: tuple[float, float] = (0.5, 8.0)  # the first wait before a probe, and the longest
    down_since: float | None = None  # None while the engine answers
    next_probe: float = 0.0
    count: int = 0  # outages so far
    _backoff: float = 0.0

    def began(self, now: float) -> bool:
        """The engine went at `now`: the first probe is due a backoff later. False when it was gone."""
        if self.down_since is not None:
            return False
        self.down_since, self._backoff = now, self.backoff_s[0]
        self.next_probe = now + self._backoff
        self.count += 1
        return True

    def probe_due(self, now: float) -> bool:
        return self.down_since is not None and now >= self.next_probe

    def probed(self, healthy: bool, now: float) -> float | None:
        """A probe's answer at `now`: the outage's length when the engine is back (it is over), else
        None, the next probe twice as far off (up to the bound)."""
        if healthy:
            length, self.down_since = now - (self.down_since or now), None
            return length
        self._backoff = min(self._backoff * 2, self.backoff_s[1])
        self.next_probe = now + self._backoff
        return None
