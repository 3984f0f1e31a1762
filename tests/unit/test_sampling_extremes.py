"""The sampler at the edges of what the front door accepts: every accepted sampling value draws a
token that could be drawn, with finite logprobs, and never fails the step (torch, no model)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from fsched.core.runners.hf.sampling import Row, choose_tokens  # noqa: E402
from fsched.core.types import SamplingParams  # noqa: E402

VOCAB = 32
TINY = (5e-324, 1e-300, 1e-45, 1e-38, 1e-7)


def logits(seed: int, scale: float) -> torch.Tensor:
    return torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("tiny", TINY)
def test_a_tiny_temperature_or_top_p_draws_the_likeliest_token(tiny):
    x = logits(1, 3.0)
    best = x.argmax(dim=-1).tolist()
    for fields in ({"temperature": tiny}, {"top_p": tiny}, {"top_p": tiny, "temperature": tiny}):
        rows = [Row(SamplingParams(max_tokens=4, seed=7, logprobs=2, **fields), 0) for _ in range(2)]
        choice = choose_tokens(x, rows)
        assert choice.tokens == best, fields
        assert all(math.isfinite(lp[0]) for lp in choice.logprobs), choice.logprobs


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 1000), scale=st.sampled_from([1.0, 50.0, 1e4]),
       temperature=st.one_of(st.sampled_from((0.0, *TINY, 2.0)), st.floats(0, 2)),
       top_p=st.one_of(st.sampled_from((*TINY, 1.0)), st.floats(5e-324, 1)),
       min_p=st.one_of(st.just(0.0), st.sampled_from((*TINY, 1.0))), top_k=st.integers(0, VOCAB + 1),
       repetition_penalty=st.sampled_from((1.0, *TINY, 1e300)))
def test_no_accepted_value_fails_the_step(seed, scale, temperature, top_p, min_p, top_k, repetition_penalty):
    if not 0 < top_p <= 1:
        return
    params = SamplingParams(max_tokens=4, seed=seed, temperature=temperature, top_p=top_p, min_p=min_p,
                            top_k=top_k, repetition_penalty=repetition_penalty, logprobs=3)
    x = logits(seed, scale)
    choice = choose_tokens(x, [Row(params, 2, output=(0, 1, 1)), Row(params, 0)])
    assert all(0 <= t < VOCAB for t in choice.tokens)
    assert all(math.isfinite(lp[0]) and all(map(math.isfinite, lp[2])) for lp in choice.logprobs)
