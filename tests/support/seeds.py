"""Seeds with which the stand-in runs as long as a test needs (it draws its end token about once in 500)."""

from __future__ import annotations

from fsched.core.runners.standin import STANDIN_EOS, standin_encode, standin_token


def long_seed(n: int, messages=None, prompt=None) -> int:
    """A seed with which the stand-in generates `n` tokens without drawing its end token, so a test's
    request runs as long as it needs."""
    for seed in range(100_000):
        if runs_long(n, seed, messages, prompt):
            return seed
    raise AssertionError("no such seed")


def runs_long(n: int, seed: int | None, messages=None, prompt=None) -> bool:
    """Whether the stand-in generates `n` tokens with this seed and input without drawing its end token."""
    context = standin_encode(prompt, messages)
    for _ in range(n):
        token = standin_token(seed, context)
        if token == STANDIN_EOS:
            return False
        context.append(token)
    return True
