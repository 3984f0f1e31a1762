"""Stop rules (pure) and reproducible sampling (torch, no model)."""

from __future__ import annotations

import pytest

from fsched.core.runners.stopping import check_stop
from fsched.core.types import RequestStatus

EOS = frozenset({2})


def stop(token=7, generated=1, max_tokens=10, context=20, limit=100, text=None, stops=()):
    return check_stop(token, generated, max_tokens, context, limit, EOS, text, stops)


def test_eos_max_tokens_and_context():
    assert stop(token=2).finished is RequestStatus.FINISHED_STOPPED
    assert stop(generated=10).finished is RequestStatus.FINISHED_LENGTH
    assert stop(context=100).finished is RequestStatus.FINISHED_LENGTH
    assert stop().finished is None


def test_stop_string_cuts_the_text_at_the_earliest_match():
    check = stop(text="hello world. bye", stops=("bye", "."))
    assert check.finished is RequestStatus.FINISHED_STOPPED and check.text_end == len("hello world")
    assert stop(text="hello", stops=("xyz",)).finished is None


def test_position_seed_mixes_seed_and_position():
    from fsched.core.runners.hf.sampling import position_seed

    seeds = {position_seed(s, p) for s in range(20) for p in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)
    assert position_seed(5, 3) == position_seed(5, 3)


def test_sampling_depends_only_on_seed_and_position():
    torch = pytest.importorskip("torch")
    from fsched.core.runners.hf.sampling import Row, choose_tokens
    from fsched.core.types import SamplingParams

    def sample(logits, params, position):
        return choose_tokens(logits.unsqueeze(0), [Row(params, position)]).tokens[0]

    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(max_tokens=5, temperature=1.0, seed=42)
    draws = [sample(logits, p, pos) for pos in range(30)]
    assert draws == [sample(logits, p, pos) for pos in range(30)]  # same seed, same positions
    assert len(set(draws)) > 5  # positions draw differently
    other = SamplingParams(max_tokens=5, temperature=1.0, seed=43)
    assert draws != [sample(logits, other, pos) for pos in range(30)]
    # top_k=1 and greedy agree; top_p keeps only the nucleus
    assert sample(logits, SamplingParams(5, temperature=1.0, top_k=1, seed=1), 0) == int(logits.argmax())
    nucleus = {
        sample(logits, SamplingParams(5, temperature=1.0, top_p=0.05, seed=1), pos) for pos in range(50)
    }
    probs = torch.softmax(logits, -1)
    top = set(torch.argsort(probs, descending=True)[:3].tolist())
    assert nucleus <= top
    rows = torch.stack([logits, logits])
    greedy = SamplingParams(5, temperature=0)
    both = choose_tokens(rows, [Row(greedy, 0), Row(p, 7)]).tokens
    assert both == [int(logits.argmax()), sample(logits, p, 7)]
