"""Choosing the next token of every row of a batch at once: the processors, then greedy or sampling.

The order is vLLM's: the grammar's mask (structured output), `min_tokens`
(no end of output yet), `logit_bias`, the repetition penalty, the frequency
and presence penalties; then greedy takes the likeliest token, and sampling
divides by the temperature, drops what `min_p`, `top_k` and `top_p` rule
out, and draws from what is left. Each step is one tensor operation over the
rows that need it, never a Python loop over rows on the device; a batch of
plain greedy rows is a bare argmax.

Every sampled token's randomness comes from (request seed, output position)
alone, never from a shared generator: the draw is the inverse of the
distribution's CDF at a uniform number derived from those two integers, so a
request that is preempted, recomputed or resumed after a restart draws
exactly the tokens an uninterrupted run draws, in any batch.

Logprobs are those of the distribution the token is drawn from: after every
processor, at the request's temperature, with the tokens that `min_p`,
`top_k`, `top_p` or a grammar ruled out at minus infinity (LOGPROB_FLOOR); a
greedy row's are the processed logits' at temperature 1. The top
alternatives hold only tokens that could have been drawn, so fewer than
asked where fewer were possible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fsched.core.types import LOGPROB_FLOOR, SamplingParams

_MASK64 = (1 << 64) - 1
# vLLM's floor: a temperature in (0, 0.01) is sampled at 0.01, below which logits / temperature
# overflow float32 (inf - inf is NaN in the softmax). Greedy (0) stays greedy.
MIN_TEMPERATURE = 1e-2
# What an overflowed logit (a tiny repetition penalty's) is held at: the likeliest, still finite.
_HIGHEST = float(torch.finfo(torch.float32).max) / 4


def position_seed(seed: int, position: int) -> int:
    """A well-mixed 63-bit seed for one (request, position): splitmix64."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def uniform(seed: int, position: int) -> float:
    """The request's uniform number in [0, 1) for the token at `position` (53 random bits)."""
    return (position_seed(seed, position) >> 10) * 2.0**-53


@dataclass(slots=True)
class Row:
    """One row to choose a token for: its parameters and what the processors read."""

    params: SamplingParams
    position: int  # the output index of the token being chosen
    output: Sequence[int] = ()  # the tokens generated so far (for the penalties)
    prompt_ids: torch.Tensor | None = None  # the prompt's distinct ids (for the repetition penalty)
    end_ids: tuple[int, ...] = ()  # tokens that would end the output (masked before min_tokens)


@dataclass(slots=True)
class Choice:
    tokens: list[int]
    # Per row: None, or (chosen token's logprob, top ids, their logprobs) when the row asks for logprobs.
    logprobs: list[tuple[float, list[int], list[float]] | None]


def choose_tokens(logits: torch.Tensor, rows: Sequence[Row], allowed: torch.Tensor | None = None) -> Choice:
    """One token per row of `logits` ([rows, vocab]); `allowed` ([rows, vocab] bool) is the grammar's."""
    if allowed is None and all(r.params.greedy and r.params.plain for r in rows):
        return Choice(logits.argmax(dim=-1).tolist(), [None] * len(rows))
    scores = logits.float().clone()
    if allowed is not None:
        scores.masked_fill_(~allowed, -math.inf)
    _min_tokens(scores, rows)
    _logit_bias(scores, rows)
    _penalties(scores, rows)
    scores.nan_to_num_(nan=-math.inf, posinf=_HIGHEST)
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        index = torch.tensor(sampled, device=scores.device)
        scores[index] = _truncated(scores[index], [rows[i].params for i in sampled])
    tokens = scores.argmax(dim=-1)
    if sampled:
        tokens[index] = _draw(scores[index], [rows[i] for i in sampled])
    chosen = tokens.tolist()
    return Choice(chosen, _logprobs(scores, rows, tokens))


def _min_tokens(scores: torch.Tensor, rows: Sequence[Row]) -> None:
    """No end of output before `min_tokens`, unless nothing else is allowed (a grammar that is done)."""
    cells = [(i, t) for i, r in enumerate(rows) if r.position < r.params.min_tokens for t in r.end_ids
             if t < scores.shape[-1]]
    if not cells:
        return
    rows_ix, cols = (torch.tensor(x, device=scores.device) for x in zip(*cells, strict=True))
    masked = scores.clone()
    masked[rows_ix, cols] = -math.inf
    still_open = torch.isfinite(masked).any(dim=-1, keepdim=True)
    torch.where(still_open, masked, scores, out=scores)


def _logit_bias(scores: torch.Tensor, rows: Sequence[Row]) -> None:
    cells = [(i, t, b) for i, r in enumerate(rows) for t, b in r.params.logit_bias]
    if not cells:
        return
    rows_ix, cols, bias = zip(*cells, strict=True)
    device = scores.device
    scores.index_put_((torch.tensor(rows_ix, device=device), torch.tensor(cols, device=device)),
                      torch.tensor(bias, device=device, dtype=scores.dtype), accumulate=True)


def _penalties(scores: torch.Tensor, rows: Sequence[Row]) -> None:
    """Repetition (prompt and output), then frequency and presence (output), as vLLM applies them."""
    penalized = [i for i, r in enumerate(rows) if r.params.penalized]
    if not penalized:
        return
    device, vocab = scores.device, scores.shape[-1]
    longest = max(len(rows[i].output) for i in penalized)
    padded = torch.full((len(penalized), longest + 1), vocab, dtype=torch.long, device=device)
    for j, i in enumerate(penalized):  # one copy per row of its output's ids, no per-token work
        if rows[i].output:
            padded[j, : len(rows[i].output)] = torch.tensor(rows[i].output, device=device)
    counts = torch.zeros(len(penalized), vocab + 1, device=device).scatter_add_(
        1, padded, torch.ones_like(padded, dtype=torch.float))[:, :vocab]
    in_output = counts > 0
    seen = in_output.clone()  # the repetition penalty's: in the prompt or the output
    for j, i in enumerate(penalized):
        if rows[i].params.repetition_penalty != 1.0 and rows[i].prompt_ids is not None:
            seen[j, rows[i].prompt_ids] = True
    index = torch.tensor(penalized, device=device)
    block = scores[index]
    params = [rows[i].params for i in penalized]
    rep = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(1)
    block = torch.where(seen, torch.where(block > 0, block / rep, block * rep), block)
    freq = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(1)
    scores[index] = block - freq * counts - pres * in_output.float()


def _truncated(scores: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The sampled rows' logits at their temperature, with what min_p, top_k and top_p drop at -inf."""
    device, vocab = scores.device, scores.shape[-1]
    temperature = torch.tensor([max(p.temperature, MIN_TEMPERATURE) for p in params], device=device)
    scores = (scores / temperature.unsqueeze(1)).nan_to_num_(nan=-math.inf, posinf=_HIGHEST)
    if any(p.min_p > 0 for p in params):
        floor = torch.tensor([math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params], device=device)
        top = scores.max(dim=-1, keepdim=True).values
        scores = scores.masked_fill(scores < top + floor.unsqueeze(1), -math.inf)
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(ks):
        kth = torch.topk(scores, max(ks), dim=-1).values
        at = torch.tensor([max(k, 1) - 1 for k in ks], device=device).unsqueeze(1)
        cut = torch.where(torch.tensor(ks, device=device).unsqueeze(1) > 0, kth.gather(1, at), -math.inf)
        scores = scores.masked_fill(scores < cut, -math.inf)
    if any(p.top_p < 1.0 for p in params):
        top_p = torch.tensor([p.top_p for p in params], device=device).unsqueeze(1)
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (at least one token).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[:, 0] = False  # a top_p that float32 rounds to 0 still keeps the likeliest token
        ordered = ordered.masked_fill(drop, -math.inf)
        scores = torch.empty_like(scores).scatter_(1, order, ordered)
    return scores


def _draw(scores: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """One token per row, by the inverse CDF at the row's (seed, position) uniform number."""
    probs = torch.softmax(scores, dim=-1).double()
    cdf = torch.cumsum(probs, dim=-1)
    u = torch.tensor([uniform(r.params.seed or 0, r.position) for r in rows], device=scores.device,
                     dtype=torch.double).unsqueeze(1)
    picked = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=scores.shape[-1] - 1)
    # Rounding can land past the last likely token: take the likeliest then (never a dropped one).
    unlikely = probs.gather(1, picked) == 0
    return torch.where(unlikely, probs.argmax(dim=-1, keepdim=True), picked).squeeze(1)


def _logprobs(scores: torch.Tensor, rows: Sequence[Row], tokens: torch.Tensor
              ) -> list[tuple[float, list[int], list[float]] | None]:
    asking = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    out: list[tuple[float, list[int], list[float]] | None] = [None] * len(rows)
    if not asking:
        return out
    index = torch.tensor(asking, device=scores.device)
    logp = torch.log_softmax(scores[index], dim=-1).clamp_(min=LOGPROB_FLOOR)
    chosen = logp.gather(1, tokens[index].unsqueeze(1)).squeeze(1).tolist()
    k = max(rows[i].params.logprobs for i in asking)
    top_lp, top_ids = torch.topk(logp, min(k, logp.shape[-1]), dim=-1) if k else (logp[:, :0], logp[:, :0])
    top_lp, top_ids = top_lp.tolist(), top_ids.long().tolist()
    for j, i in enumerate(asking):
        # Only tokens that could have been drawn: the ruled-out ones tie at the floor, in no order.
        n = sum(lp > LOGPROB_FLOOR for lp in top_lp[j][: rows[i].params.logprobs])
        out[i] = (chosen[j], top_ids[j][:n], top_lp[j][:n])
    return out
