"""Test doubles shared by unit and integration tests."""

from __future__ import annotations


class FakeClock:
    """A clock a test moves: `advance` (also usable as `sleep`), and an optional tick per read,
    so code that loops on the clock sees time pass without real waiting."""

    def __init__(self, start: float = 1_000.0, tick: float = 0.0):
        self.now = start
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
