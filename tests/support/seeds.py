"""Seeds with which the stand-in runs as long as a test needs (it draws its end token about once in 500).

A sampled request sent to the stand-in engine server (tests/support/fake_engine.py) is drawn there
under a seed mixed with each draw's index, not under the request's seed as the built-in stand-in
draws it: `engine_sampled` asks about that engine's draws instead."""

from __future__ import annotations

from fsched.core.runners.standin import STANDIN_EOS, standin_encode, standin_token
from tests.support.fake_engine import draw_seed


def long_seed(n: int, messages=None, prompt=None, engine_sampled: bool = False) -> int:
    """A seed with which the stand-in generates `n` tokens without drawing its end token, so a test's
    request runs as long as it needs."""
    for seed in range(100_000):
        if runs_long(n, seed, messages, prompt, engine_sampled):
            return seed
    raise AssertionError("no such seed")


def runs_long(n: int, seed: int | None, messages=None, prompt=None, engine_sampled: bool = False) -> bool:
    """Whether the stand-in generates `n` tokens with this seed and input without drawing its end token
    (`engine_sampled`: whether the stand-in engine server's sampled draws do)."""
    context = standin_encode(prompt, messages)
    for drawn in range(n):
        token = standin_token(draw_seed(seed, drawn) if engine_sampled else seed, context)
        if token == STANDIN_EOS:
            return False
        context.append(token)
    return True
