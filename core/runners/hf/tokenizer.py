"""A model folder's tokenizer and what it says about the model, without loading the weights.

What a remote engine's runner needs from the model: fsched encodes prompts
itself (chat template included, exactly as the built-in runner does) and
decodes the token ids the engine returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase, TokenizersBackend

from fsched.core.runners.hf.decoding import BackendDecode
from fsched.core.runners.hf.model import (
    TINY_MODEL_NAME,
    TINY_SPEC,
    ModelLoadError,
    ensure_tiny_model,
    render_prompt,
)


@dataclass(slots=True)
class TokenizerOnly:
    """A model folder's tokenizer and figures; `encode_prompt` takes it as it takes a loaded model."""

    tokenizer: PreTrainedTokenizerBase
    name: str
    path: str
    context_length: int
    eos_token_ids: frozenset[int]
    # `decode` and `decode_special`: one call into the tokenizer's library where transformers adds nothing
    decode: Callable[[list[int]], str] = field(init=False, repr=False)
    decode_special: Callable[[list[int]], str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.decode = decoder(self.tokenizer, skip_special_tokens=True)
        self.decode_special = decoder(self.tokenizer, skip_special_tokens=False)


def decoder(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=...)` of a list of ids. A fast tokenizer whose decoding
    transformers neither overrides nor cleans up after (no `clean_up_tokenization_spaces`, or a BPE model,
    where transformers skips that cleanup) decodes in its `tokenizers` backend alone: the same text
    without transformers' checks of the ids around it (a third of the cost, at two decodes a streamed
    token); any other tokenizer decodes through transformers."""
    kind = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    if (isinstance(tokenizer, TokenizersBackend) and backend is not None
            and kind.decode is PreTrainedTokenizerBase.decode and kind._decode is TokenizersBackend._decode
            and not _cleans_up(tokenizer, backend)):
        return BackendDecode(backend, skip_special_tokens)
    return partial(tokenizer.decode, skip_special_tokens=skip_special_tokens)


def _cleans_up(tokenizer: TokenizersBackend, backend) -> bool:
    """Whether transformers' decode cleans the text's spaces up after the backend's decoding."""
    if not tokenizer.clean_up_tokenization_spaces:
        return False
    forced = getattr(tokenizer, _FORCED_CLEANUP, False)
    return type(backend.model).__name__ != "BPE" or bool(forced)


_FORCED_CLEANUP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def load_tokenizer(spec: str | None) -> TokenizerOnly:
    """The tokenizer of `spec`: None or "tiny" for the built-in model's, or a model folder."""
    is_tiny = spec in (None, TINY_SPEC)
    path = str(ensure_tiny_model()) if is_tiny else str(spec)
    if not Path(path).is_dir():
        raise ModelLoadError(f"--model {path!r}: with --engine, give the model's folder (its tokenizer "
                             "encodes prompts and decodes the engine's tokens)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {path!r}: {exc}") from None
    config = _json(Path(path) / "config.json")
    generation = _json(Path(path) / "generation_config.json")
    context = (config.get("max_position_embeddings") or config.get("n_positions")
               or getattr(tokenizer, "model_max_length", None) or 2048)
    eos: set[int] = set()
    for source in (generation, config):
        value = source.get("eos_token_id")
        eos.update([value] if isinstance(value, int) else (value or []))
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    name = TINY_MODEL_NAME if is_tiny else Path(path.rstrip("/")).name
    return TokenizerOnly(tokenizer, name, path, int(min(context, 10**7)), frozenset(eos))


def chat_renderer(spec: str) -> Callable[[list[dict], dict | None], str]:
    """The text a chat's messages (and `render`: ChatRender.to_json()) become through the chat template of
    the model folder `spec`, exactly as the runners render them before encoding; the renderer raises
    ValueError when the template refuses the messages."""
    tokenizer = load_tokenizer(spec).tokenizer

    def rendered(messages: list[dict], render: dict | None) -> str:
        try:
            return render_prompt(tokenizer, messages, render)
        except (TemplateError, TypeError, KeyError) as exc:
            raise ValueError(str(exc)) from None

    return rendered


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
