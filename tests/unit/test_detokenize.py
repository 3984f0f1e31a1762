"""The incremental detokenizer against decoding the whole sequence: byte-identical on every prefix.

A byte-level BPE tokenizer trained as the tiny model's is (on the shipped
corpus, with its special tokens), fed random token sequences: any id,
so characters split over tokens, multi-byte characters and special tokens
(kept or skipped) all come, one or several tokens a call.
"""

from __future__ import annotations

import random
from functools import cache, partial
from importlib import resources

import pytest

from fsched.core.runners.detokenize import Detokenizer


@cache
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = resources.files("fsched.core").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=1,
                                  special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text.split("\n"), trainer=trainer)
    tok.add_tokens(["é", "日本", "🙂"])  # added tokens decode apart from the byte-level ones
    return tok


def sequence(rng: random.Random, n: int) -> list[int]:
    tok = tokenizer()
    size = tok.get_vocab_size()
    words = ["naïve café", "日本語のテキスト", "emoji 🙂👍🏽 ok", " plain words", "Ωμέγα", "\n\t"]
    out: list[int] = []
    while len(out) < n:
        pick = rng.random()
        if pick < 0.4:
            out += tok.encode(rng.choice(words)).ids
        elif pick < 0.5:
            out.append(rng.randrange(3))  # a special token
        else:
            out.append(rng.randrange(size))  # any id: bytes of characters split anyhow
    return out[:n]


@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_every_prefix_decodes_as_the_whole_sequence_does(seed: int, skip_special: bool) -> None:
    rng = random.Random(seed)
    decode = partial(tokenizer().decode, skip_special_tokens=skip_special)
    tokens = sequence(rng, 300)
    detok, upto = Detokenizer(decode), 0
    while upto < len(tokens):
        upto = min(len(tokens), upto + rng.choice([1, 1, 1, 2, 5]))
        assert detok.text(tokens[:upto]) == decode(tokens[:upto]), upto


def test_a_list_grown_in_place_and_a_changed_one() -> None:
    decode = tokenizer().decode
    rng = random.Random(7)
    output: list[int] = []
    detok = Detokenizer(decode)
    for token in sequence(rng, 120):
        output.append(token)
        assert detok.text(output) == decode(output)
    assert detok.text(output[:-1]) == decode(output[:-1])  # a final token dropped (an EOS)
    other = output[:60] + sequence(random.Random(8), 10)  # not a growth of what was read: decoded whole
    assert detok.text(other) == decode(other)
