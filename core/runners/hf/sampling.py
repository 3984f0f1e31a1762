"""Choosing the next token: greedy, or temperature / top-k / top-p sampling.

Every sampled token's randomness comes from (request seed, output position)
alone, never from a shared generator, so a request that is preempted,
recomputed or resumed after a restart draws exactly the tokens an
uninterrupted run draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fsched.core.types import SamplingParams

_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """A well-mixed 63-bit seed for one (request, position): splitmix64."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def choose_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]
) -> list[int]:
    """One token per row of `logits` ([rows, vocab]); `positions[i]` is row i's output index."""
    chosen = logits.argmax(dim=-1).tolist()
    for row, (p, position) in enumerate(zip(params, positions, strict=True)):
        if not p.greedy:
            chosen[row] = sample(logits[row], p, position)
    return chosen


def sample(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (at least one token).
        drop = cumulative - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    generator = torch.Generator(device=probs.device)
    generator.manual_seed(position_seed(params.seed or 0, position))
    return int(torch.multinomial(probs, 1, generator=generator).item())
