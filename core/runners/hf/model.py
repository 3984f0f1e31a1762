"""Loading a causal LM: a local Hugging Face folder, a cached hub id, or the tiny default.

The tiny default model is built offline and deterministically from text the
package ships (a byte-level BPE tokenizer and a small random Llama), saved
with `save_pretrained` and loaded back through `from_pretrained`: the very
path a real model folder takes. It is random, so its text is nonsense; it
is labelled so wherever it is shown.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

TINY_MODEL_NAME = "fsched-tiny (random weights)"
TINY_VERSION = 1  # bump when the recipe changes: a new cache folder is built
TINY_SEED = 20261130
TINY_SPEC = "tiny"


class ModelLoadError(Exception):
    """The model could not be loaded; the message says why."""


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    name: str
    path: str
    device: torch.device
    dtype: torch.dtype
    context_length: int
    eos_token_ids: frozenset[int]
    is_tiny: bool

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> str:
        return f"{self.name} on {self.device} ({str(self.dtype).removeprefix('torch.')})"


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {device!r}: {exc}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} asked for, but CUDA is not available here")
    if resolved.type == "cuda" and resolved.index is not None:
        count = torch.cuda.device_count()
        if resolved.index >= count:
            raise ModelLoadError(f"device {device!r} asked for, but this machine has {count} GPU(s): "
                                 f"cuda:0 to cuda:{count - 1}")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
            # Batch shapes change fp32's last bits, and a seeded draw near a boundary can flip on them;
            # fp64 leaves outputs that compare bit for bit across batch shapes and resumes (CPU checks).
            "float64": torch.float64,
            "fp64": torch.float64,
        }[dtype]
    except KeyError:
        raise ModelLoadError(
            f"unknown dtype {dtype!r}: use auto, float32, bfloat16, float16 or float64") from None


def set_threads(threads: int) -> None:
    """CPU threads torch may use (intra-op)."""
    torch.set_num_threads(threads)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fsched"


def load_model(spec: str | None = None, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """Load `spec`: None or "tiny" for the built-in model, a folder, or a hub id in the local cache."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    is_tiny = spec in (None, TINY_SPEC)
    path = str(ensure_tiny_model()) if is_tiny else spec
    if not is_tiny and not Path(path).is_dir():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub id: only what is cached locally
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model {path!r}: {first}") from None
    model.to(torch_device)
    model.eval()
    config = model.config
    context = (
        getattr(config, "max_position_embeddings", None)
        or getattr(config, "n_positions", None)
        or getattr(tokenizer, "model_max_length", None)
        or 2048
    )
    eos = _eos_ids(model, tokenizer)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=TINY_MODEL_NAME if is_tiny else Path(path.rstrip("/")).name or path,
        path=path,
        device=torch_device,
        dtype=torch_dtype,
        context_length=int(context),
        eos_token_ids=eos,
        is_tiny=is_tiny,
    )


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


# -- the tiny default model ---------------------------------------------------------


def ensure_tiny_model(root: Path | None = None) -> Path:
    """The tiny model's folder, built on first use (a few seconds) and cached."""
    folder = (root or cache_root()) / f"tiny-model-v{TINY_VERSION}"
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.{os.getpid()}"
    build_tiny_model(staging)
    try:
        staging.rename(folder)  # atomic: a concurrent builder's result is as good
    except OSError:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return folder


def build_tiny_model(folder: Path) -> None:
    """Train a byte-level BPE tokenizer on the shipped corpus and save a random Llama beside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    text = resources.files("fsched.core").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.split("\n"), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        model_max_length=2048,
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        # Large enough that a random model's outputs vary from token to token;
        # the usual 0.02 makes it repeat one token, and tests compare nothing.
        initializer_range=0.1,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "fsched.json").write_text(
        json.dumps({"tiny": True, "version": TINY_VERSION, "seed": TINY_SEED, "label": TINY_MODEL_NAME})
    )


def encode_prompt(
    loaded: LoadedModel, prompt: str | None = None, messages: list[dict] | None = None,
    render: dict | None = None,
) -> list[int]:
    """Token ids of a completion prompt, or of chat messages through the chat template, given the
    tools and template options of `render` (ChatRender.to_json()) too."""
    tokenizer = loaded.tokenizer
    if messages is not None:
        if getattr(tokenizer, "chat_template", None):
            # What `apply_chat_template(tokenize=True)` gives: the rendered text, no special tokens added.
            return encode_text(tokenizer, _apply_template(tokenizer, messages, render, tokenize=False),
                               add_special_tokens=False)
        prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return encode_text(tokenizer, prompt or "", add_special_tokens=True)


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    """`tokenizer(text, add_special_tokens=...)["input_ids"]`. A fast tokenizer whose encoding transformers
    does not override encodes in its `tokenizers` backend alone, while the backend truncates and pads
    nothing (transformers turns both off before each call of its own) and splits special tokens as
    transformers would: the same ids without transformers' argument handling and `BatchEncoding` around
    them (of 110 µs a chat prompt of the tiny model, 42 were that wrapping)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if (_encodes_in_backend(type(tokenizer)) and backend is not None and backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))):
        return backend.encode(text, add_special_tokens=add_special_tokens).ids
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


@functools.cache
def _encodes_in_backend(kind: type) -> bool:
    from transformers import TokenizersBackend

    return (issubclass(kind, TokenizersBackend)
            and all(getattr(kind, name, None) is getattr(PreTrainedTokenizerBase, name, None)
                    for name in ("__call__", "_call_one", "encode_plus"))
            and kind._encode_plus is TokenizersBackend._encode_plus)


def render_prompt(tokenizer, messages: list[dict], render: dict | None = None) -> str:
    """The text `encode_prompt` encodes for chat messages (through the chat template)."""
    return _apply_template(tokenizer, messages, render, tokenize=False)


def _apply_template(tokenizer, messages: list[dict], render: dict | None, tokenize: bool):
    tools = (render or {}).get("tools") or None
    kwargs = (render or {}).get("kwargs") or {}
    return tokenizer.apply_chat_template(template_messages(messages), tools=tools, add_generation_prompt=True,
                                         tokenize=tokenize, **kwargs)


def template_messages(messages: list[dict]) -> list[dict]:
    """Stored messages as chat templates read them: a call's arguments as an object (templates write
    them with `tojson`), where the stored JSON text parses to one (as vLLM hands them over)."""
    return [_for_template(m) if m.get("tool_calls") else m for m in messages]


def _for_template(message: dict) -> dict:
    calls = []
    for call in message["tool_calls"]:
        function = dict(call["function"])
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            function["arguments"] = arguments
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}
