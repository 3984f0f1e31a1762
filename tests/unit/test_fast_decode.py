"""A remote engine's tokens decoded in the `tokenizers` backend alone, where transformers would add nothing:
the same text as transformers' decode, without going through it; a tokenizer whose decoding transformers
cleans up still goes through it."""

from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerFast, TokenizersBackend

from fsched.core.runners.hf.tokenizer import TokenizerOnly, decoder
from tests.unit.test_detokenize import sequence, tokenizer


def fast(cleanup: bool) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer(), eos_token="<|eos|>", pad_token="<|pad|>",
                                   clean_up_tokenization_spaces=cleanup)


@pytest.mark.parametrize("cleanup", [False, True])  # a BPE model: transformers skips the cleanup either way
@pytest.mark.parametrize("skip_special", [True, False])
def test_the_backend_decodes_as_transformers_does(cleanup: bool, skip_special: bool) -> None:
    tok, rng = fast(cleanup), random.Random(7)
    decode = decoder(tok, skip_special_tokens=skip_special)
    for n in (0, 1, 2, 5, 40, 200):
        ids = sequence(rng, n)
        assert decode(ids) == tok.decode(ids, skip_special_tokens=skip_special)


def test_a_remote_engines_tokens_skip_transformers_decode(monkeypatch) -> None:
    tok = fast(False)
    only = TokenizerOnly(tok, "t", "/nowhere", 512, frozenset())
    ids = sequence(random.Random(3), 30)
    expected, kept = tok.decode(ids, skip_special_tokens=True), tok.decode(ids, skip_special_tokens=False)

    def refused(*args, **kwargs):
        raise AssertionError("decoded through transformers")

    monkeypatch.setattr(TokenizersBackend, "_decode", refused)
    assert only.decode(ids) == expected
    assert only.decode_special(ids) == kept


def test_a_tokenizer_transformers_cleans_up_after_decodes_through_it() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, ",": 2, "world": 3, "!": 4}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(cleanup=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]",
                                  clean_up_tokenization_spaces=True)
    ids = [1, 2, 3, 4]
    assert backend.decode(ids) == "hello , world !"
    assert decoder(tok, skip_special_tokens=True)(ids) == "hello, world!"
    assert decoder(tok, skip_special_tokens=True)(ids) == tok.decode(ids, skip_special_tokens=True)
