"""Prompts encoded in the `tokenizers` backend alone, where transformers would add nothing: the ids of
transformers' own call (and of `apply_chat_template(tokenize=True)` for chat messages), without going
through it; a backend left truncating, or one not told to split special tokens where the tokenizer
splits them, still goes through it."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast, TokenizersBackend

from fsched.core.runners.hf.model import encode_prompt, encode_text
from fsched.core.runners.hf.tokenizer import TokenizerOnly
from tests.unit.test_detokenize import tokenizer

TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}")
TEXTS = ["", "plain words", "naïve café 日本語 🙂👍🏽", "<|bos|>a special token inside<|eos|>", " \n\t lead"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "日本 <|eos|> é 🙂 ok?"}]


def fast(split_special_tokens: bool = False) -> PreTrainedTokenizerFast:
    from tokenizers import processors

    backend = tokenizer()
    backend.post_processor = processors.TemplateProcessing(single="<|bos|> $A",
                                                           special_tokens=[("<|bos|>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|bos|>", eos_token="<|eos|>",
                                  pad_token="<|pad|>", split_special_tokens=split_special_tokens)
    tok.chat_template = TEMPLATE
    return tok


def calls_through_transformers(monkeypatch) -> list[int]:
    """Count the calls that go through transformers' encoding."""
    calls: list[int] = []
    original = TokenizersBackend._encode_plus

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TokenizersBackend, "_encode_plus", counted)
    return calls


@pytest.mark.parametrize("special", [True, False])
def test_the_backend_encodes_as_transformers_does(monkeypatch, special: bool) -> None:
    tok = fast()
    expected = [tok(text, add_special_tokens=special)["input_ids"] for text in TEXTS]
    calls = calls_through_transformers(monkeypatch)
    assert [encode_text(tok, text, special) for text in TEXTS] == expected
    assert calls == []


def test_a_chat_prompt_is_what_apply_chat_template_tokenizes(monkeypatch) -> None:
    tok = fast()
    expected = list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"])
    plain = tok("plain words")["input_ids"]
    only = TokenizerOnly(tok, "t", "/nowhere", 512, frozenset())
    calls = calls_through_transformers(monkeypatch)
    assert encode_prompt(only, None, MESSAGES) == expected
    assert encode_prompt(only, "plain words") == plain
    assert calls == []


def test_a_backend_left_truncating_encodes_through_transformers(monkeypatch) -> None:
    tok = fast()
    tok._tokenizer.enable_truncation(max_length=3)
    calls = calls_through_transformers(monkeypatch)
    ids = encode_text(tok, "plain words and more words", True)
    assert calls == [1]
    assert len(ids) > 3  # transformers turns the backend's truncation off for a call that asks none
    assert ids == tok("plain words and more words")["input_ids"]


def test_a_tokenizer_splitting_special_tokens_encodes_as_it_says(monkeypatch) -> None:
    expected = fast(split_special_tokens=True)(TEXTS[3], add_special_tokens=False)["input_ids"]
    assert 1 not in expected and 2 not in expected  # the markers are split as text
    tok = fast(split_special_tokens=True)
    calls = calls_through_transformers(monkeypatch)
    assert encode_text(tok, TEXTS[3], False) == expected
    assert calls == []
    tok._tokenizer.encode_special_tokens = False  # a backend told otherwise: through transformers
    assert encode_text(tok, TEXTS[3], False) == expected
    assert calls == [1]
