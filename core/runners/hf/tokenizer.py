"""A model folder's tokenizer and what it says about the model, without loading the weights.

What a remote engine's runner needs from the model: fsched encodes prompts
itself (chat template included, exactly as the built-in runner does) and
decodes the token ids the engine returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

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

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


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
