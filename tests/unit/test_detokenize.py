"""The incremental detokenizer against decoding the whole sequence: byte-identical on every prefix.

A byte-level BPE tokenizer trained as the tiny model's is (on the shipped
corpus, with its special tokens), fed random token sequences: any id,
so characters split over tokens, multi-byte characters and special tokens
(kept or skipped) all come, one or several tokens a call. A SentencePiece-like
one (Llama 2's decoder: "▁" for spaces, byte fallback, the first space
stripped) decodes the same way, the library's stream of it included.
"""

from __future__ import annotations

import random
from functools import cache, partial
from importlib import resources

import pytest

from fsched.core.runners.detokenize import Detokenizer
from fsched.core.runners.hf.decoding import BackendDecode


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


@cache
def sentencepiece_like():
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    text = resources.files("fsched.core").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>", *bytes_],
                                  show_progress=False)
    tok.train_from_iterator(text.split("\n"), trainer=trainer)
    return tok


def sequence(rng: random.Random, n: int, tok=None) -> list[int]:
    tok = tok or tokenizer()
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


def decoder(way: str, skip_special: bool, tok=None):
    """The window's way (any decode function) or the library's stream (a backend's own decode)."""
    tok = tok or tokenizer()
    if way == "window":
        return partial(tok.decode, skip_special_tokens=skip_special)
    return BackendDecode(tok, skip_special)


@pytest.mark.parametrize("way", ["window", "stream"])
@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_every_prefix_decodes_as_the_whole_sequence_does(seed: int, skip_special: bool, way: str) -> None:
    rng = random.Random(seed)
    decode = decoder(way, skip_special)
    tokens = sequence(rng, 300)
    detok, upto = Detokenizer(decode), 0
    while upto < len(tokens):
        upto = min(len(tokens), upto + rng.choice([1, 1, 1, 2, 5]))
        assert detok.text(tokens[:upto]) == decode(tokens[:upto]), upto
    assert (detok._stream is not None) == (way == "stream")  # the stream way kept its stream throughout


@pytest.mark.parametrize("way", ["window", "stream"])
def test_a_list_grown_in_place_and_a_changed_one(way: str) -> None:
    decode = decoder(way, False)
    rng = random.Random(7)
    output: list[int] = []
    detok = Detokenizer(decode)
    for token in sequence(rng, 120):
        output.append(token)
        assert detok.text(output) == decode(output)
    assert detok.text(output[:-1]) == decode(output[:-1])  # a final token dropped (an EOS)
    other = output[:60] + sequence(random.Random(8), 10)  # not a growth of what was read: decoded whole
    assert detok.text(other) == decode(other)


def test_a_stream_that_fails_leaves_the_window_to_go_on() -> None:
    """The library's stream refuses a step where a decoder rewrote text it had settled: from there the
    window's way decodes, and every text is still the whole sequence's."""
    def refusing(token: int) -> str | None:
        raise RuntimeError("Invalid prefix encountered")

    decode = decoder("stream", True)
    tokens = sequence(random.Random(3), 80)
    detok = Detokenizer(decode)
    assert detok.text(tokens[:40]) == decode(tokens[:40])
    detok._stream = refusing
    for upto in range(41, 81):
        assert detok.text(tokens[:upto]) == decode(tokens[:upto]), upto
    assert detok._stream is None


def test_a_backend_decode_pickles_as_itself() -> None:
    import pickle

    decode = decoder("stream", False)
    again = pickle.loads(pickle.dumps(decode))
    assert type(again) is BackendDecode and not again.skip_special_tokens
    assert again([5, 6, 7]) == decode([5, 6, 7])


@pytest.mark.parametrize("way", ["window", "stream"])
@pytest.mark.parametrize("seed", range(4))
def test_a_sentencepiece_like_decoder_decodes_every_prefix_as_the_whole_sequence(seed: int, way: str) -> None:
    """Its first space stripped and bytes falling back: where the library's stream refuses a step (a
    random id sequence can make the window's text start otherwise than the settled text ends), the
    window's way takes over, and every text is still the whole sequence's."""
    tok = sentencepiece_like()
    rng = random.Random(seed)
    for skip_special in (True, False):
        decode = decoder(way, skip_special, tok)
        tokens = sequence(rng, 200, tok)
        detok, upto = Detokenizer(decode), 0
        while upto < len(tokens):
            upto = min(len(tokens), upto + rng.choice([1, 1, 1, 2, 5]))
            assert detok.text(tokens[:upto]) == decode(tokens[:upto]), upto


def test_tokens_that_come_together_go_to_the_library_stream_in_one_call() -> None:
    """A fresh request's whole output (a batch request's text when it ends) or a chunk of several tokens
    is one call into the library, as the window's one decode was, not a call a token."""
    decode = decoder("stream", True)
    tokens = sequence(random.Random(5), 120)
    detok = Detokenizer(decode)
    stream, calls = detok._stream, []
    detok._stream = lambda ids: (calls.append(ids), stream(ids))[1]
    assert detok.text(tokens[:100]) == decode(tokens[:100])
    assert detok.text(tokens[:103]) == decode(tokens[:103])
    assert detok.text(tokens) == decode(tokens)
    assert [len(c) if isinstance(c, list) else 1 for c in calls] == [100, 3, 17]
