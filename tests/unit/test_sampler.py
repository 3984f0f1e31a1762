"""The batched sampler's processors (torch, no model): each does what vLLM's does, on any batch."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fsched.core.runners.hf.sampling import Row, choose_tokens  # noqa: E402
from fsched.core.runners.stopping import StopRules, StopText, check_stop  # noqa: E402
from fsched.core.types import LOGPROB_FLOOR, RequestStatus, SamplingParams  # noqa: E402

VOCAB = 64


def logits_of(seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def one(logits: torch.Tensor, **fields) -> int:
    row = Row(SamplingParams(max_tokens=50, **{"temperature": 0, **fields}), 0)
    return choose_tokens(logits, [row]).tokens[0]


def test_logit_bias_moves_a_token_to_the_top_or_out():
    logits = logits_of(0)
    best = int(logits.argmax())
    low = int(logits.argmin())
    assert one(logits, logit_bias=((low, 100.0),)) == low
    second = one(logits, logit_bias=((best, -100.0),))
    assert second != best and second == int(logits[0].topk(2).indices[1])


def test_penalties_follow_vllm_definitions():
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.4]])
    p = SamplingParams(max_tokens=9, temperature=0, repetition_penalty=2.0, frequency_penalty=0.5,
                       presence_penalty=0.25, logprobs=4)
    row = Row(p, 3, output=(0, 0, 2), prompt_ids=torch.tensor([1]))
    # token 0: 2/2 - 0.5*2 - 0.25 = -0.25; token 1 (prompt only): 1/2 = 0.5;
    # token 2: -1*2 - 0.5 - 0.25 = -2.75; token 3 unseen: 0.4
    expected = torch.log_softmax(torch.tensor([-0.25, 0.5, -2.75, 0.4]), -1)
    choice = choose_tokens(logits, [row])
    chosen, top_ids, top_lps = choice.logprobs[0]
    assert choice.tokens == [1]
    assert chosen == pytest.approx(float(expected[1]))
    assert sorted(top_ids) == [0, 1, 2, 3]
    assert [lp for _, lp in sorted(zip(top_ids, top_lps, strict=True))] == pytest.approx(expected.tolist())


def test_min_p_keeps_only_tokens_near_the_likeliest():
    logits = torch.tensor([[5.0, 5.0 + math.log(0.6), 5.0 + math.log(0.05)] + [-20.0] * (VOCAB - 3)])
    draws = {choose_tokens(logits, [Row(SamplingParams(10, temperature=1.0, min_p=0.1, seed=s), 0)]).tokens[0]
             for s in range(200)}
    assert draws == {0, 1}


def test_min_tokens_masks_the_end_until_it_is_reached_unless_nothing_else_is_allowed():
    logits = logits_of(1)
    eos = int(logits.argmax())
    p = SamplingParams(max_tokens=10, temperature=0, min_tokens=3)
    assert choose_tokens(logits, [Row(p, 2, end_ids=(eos,))]).tokens[0] != eos
    assert choose_tokens(logits, [Row(p, 3, end_ids=(eos,))]).tokens[0] == eos
    only_eos = torch.zeros(1, VOCAB, dtype=torch.bool)
    only_eos[0, eos] = True  # a grammar that is done allows only EOS: it wins over min_tokens
    assert choose_tokens(logits, [Row(p, 0, end_ids=(eos,))], only_eos).tokens[0] == eos


def test_a_grammar_mask_is_never_crossed_and_logprobs_are_of_the_drawn_distribution():
    logits = logits_of(2, rows=3)
    allowed = torch.zeros(3, VOCAB, dtype=torch.bool)
    allowed[:, 10:14] = True
    rows = [Row(SamplingParams(10, temperature=t, seed=7, logprobs=5, top_k=k), 4)
            for t, k in ((0.0, 0), (0.8, 0), (1.5, 2))]
    choice = choose_tokens(logits, rows, allowed)
    assert all(10 <= t < 14 for t in choice.tokens)
    for i, (chosen, ids, lps) in enumerate(choice.logprobs):
        kept = 2 if i == 2 else 4
        # Only what could have been drawn: the mask (and top_k) leave fewer than 5.
        assert len(ids) == kept and set(ids) <= set(range(10, 14)) and lps == sorted(lps, reverse=True)
        assert sum(math.exp(lp) for lp in lps) == pytest.approx(1.0)  # all the mass is on allowed tokens
        assert all(lp > LOGPROB_FLOOR for lp in lps)
        assert chosen == pytest.approx(lps[ids.index(choice.tokens[i])])
    greedy_lp = torch.log_softmax(logits[0].masked_fill(~allowed[0], -math.inf), -1)
    assert choice.logprobs[0][0] == pytest.approx(float(greedy_lp.max()))  # temperature 1 for greedy
    scaled = torch.log_softmax(logits[1].masked_fill(~allowed[1], -math.inf) / 0.8, -1)
    assert choice.logprobs[1][0] == pytest.approx(float(scaled[choice.tokens[1]]))


def test_a_row_draws_the_same_token_in_any_batch():
    logits = logits_of(3, rows=8)
    params = [SamplingParams(10, temperature=0.9, top_p=0.8, top_k=20 if i % 2 else 0, min_p=0.02 * (i % 3),
                             presence_penalty=0.3 * (i % 2), seed=100 + i, logprobs=2 if i % 4 == 0 else None)
              for i in range(8)]
    rows = [Row(p, 5, output=(1, 2, 3)) for p in params]
    together = choose_tokens(logits, rows)
    alone = [choose_tokens(logits[i : i + 1], [rows[i]]) for i in range(8)]
    assert together.tokens == [a.tokens[0] for a in alone]
    assert together.logprobs == [a.logprobs[0] for a in alone]
    shuffled = [7, 2, 5, 0, 1, 6, 3, 4]
    again = choose_tokens(logits[shuffled], [rows[i] for i in shuffled])
    assert again.tokens == [together.tokens[i] for i in shuffled]


def test_sampling_matches_the_distribution():
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)] + [-50.0] * (VOCAB - 3)])
    counts = [0, 0, 0]
    for s in range(3000):
        counts[choose_tokens(logits, [Row(SamplingParams(5, temperature=1.0, seed=s), 0)]).tokens[0]] += 1
    assert [c / 3000 for c in counts] == pytest.approx([0.1, 0.3, 0.6], abs=0.03)


def test_stop_rules():
    eos = frozenset({2})

    def check(token, generated, text=None, **rules):
        read = None
        if text is not None and rules.get("stop"):
            read = StopText(rules["stop"], lambda tokens: "".join(map(chr, tokens)))
            read.extend([ord(c) for c in text])
        return check_stop(token, generated, 10, 20, 100, eos, read, rules=StopRules(**rules))

    assert check(2, 1, ignore_eos=True).finished is None
    assert check(2, 1, min_tokens=3).finished is None and check(2, 3, min_tokens=3).on_token
    assert check(9, 1, stop_token_ids=frozenset({9})).finished is RequestStatus.FINISHED_STOPPED
    assert check(7, 1, "ab END cd", stop=("END",)).text_end == 3
    assert check(7, 1, "ab END cd", stop=("END",), include_stop=True).text_end == 6
    assert check(7, 2, "ab END", stop=("END",), min_tokens=4).finished is None
    assert check(7, 10, "x", min_tokens=10).finished is RequestStatus.FINISHED_LENGTH
