"""Connecting to a remote engine: its figures, the model's tokenizer, a RemoteRunner over both.

The engine's batch (`max_num_seqs`) and KV cache (blocks x block size) become
the scheduler's budgets where its metrics say them. The runner speaks the
engine's token interface (`/inference/v1/generate`, core/runners/tokens_api.py)
where the engine serves it, else `/v1/completions` (`ENGINE_APIS`); at a
`front://HOST:PORT` URL it speaks to fsched's own front for vLLM's engine
core (core/runners/vllm_front.py, core/runners/front_link.py): the token
interface's requests, every stream on one connection. fsched encodes prompts
itself, with the model folder's tokenizer and chat template, exactly as the
built-in runner does, and the engine sees token ids only; `standin` as the
model gives the stand-in's ids instead (for the stand-in engine server).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from fsched.core.runners.front_link import FrontClient, is_front_url
from fsched.core.runners.openai_http import EngineClient, EngineHTTPError
from fsched.core.runners.remote import COMPLETIONS, Codec, EngineApi, RemoteRunner
from fsched.core.runners.standin import STANDIN_EOS, STANDIN_NAME, parse_standin, standin_encode, standin_text
from fsched.core.runners.tokens_api import GENERATE_PATH, front_api, tokens_api

log = logging.getLogger("fsched.daemon")

# Without a figure from the engine: vLLM's own default number of sequences in a batch.
DEFAULT_ENGINE_BATCH = 64
# A step gathers what the engine produced since the last one; the prefill budget per step is the
# engine's concern, so fsched's own is large enough never to hold an admission back.
ENGINE_STEP_TOKENS = 8192
# A step here is several of the engine's iterations: two steps of progress are the minimum quantum
# before a request may be preempted (an abort and a resume cost a prefix-cache hit, not nothing).
ENGINE_MIN_QUANTUM_STEPS = 2
# How the daemon asks the engine for tokens: "auto" takes the token interface where the engine serves
# it (no detokenizing on the engine's side), else the completions every OpenAI-compatible engine has;
# "front" is fsched's front for vLLM's engine core, taken by "auto" at a front:// URL.
ENGINE_APIS = ("auto", "tokens", "completions", "front")


@dataclass(slots=True, frozen=True)
class RemoteEngine:
    runner: RemoteRunner
    name: str
    description: str
    url: str
    max_batch: int
    kv_tokens: int | None
    step_tokens: int
    min_quantum_steps: int
    api: str  # the engine interface the runner speaks: "tokens", "completions" or "front"


def codec_for(model: str | None) -> tuple[str, Codec]:
    """The model's name and codec: the stand-in's for "standin", else the tokenizer of the tiny model
    (None or "tiny") or of a model folder; ValueError when it cannot be loaded."""
    if parse_standin(model) is not None:
        return STANDIN_NAME, Codec(standin_text, frozenset({STANDIN_EOS}), 8192, standin_encode)
    from fsched.core.runners.hf.model import ModelLoadError, encode_prompt
    from fsched.core.runners.hf.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(model)
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from None
    return tok.name, Codec(
        tok.decode, tok.eos_token_ids, tok.context_length, lambda p, m, r=None: encode_prompt(tok, p, m, r),
        tok.decode_special,
    )


def codec_for_served(spec: str | None, served: Sequence[str]) -> tuple[str, Codec]:
    """The codec `fsched serve` encodes with: the folder (or "standin", "tiny") it was told, else the
    one the daemons' model is known by (the stand-in's, the tiny model's); ValueError otherwise."""
    if spec is None:
        from fsched.core.runners.hf.model import TINY_MODEL_NAME

        known = {STANDIN_NAME: "standin", TINY_MODEL_NAME: "tiny"}
        if len(served) != 1 or served[0] not in known:
            raise ValueError(f"this server does not know the tokenizer of {', '.join(served)}: start "
                             "fsched serve with --tokenizer MODEL_FOLDER (the daemons' model)")
        spec = known[served[0]]
    try:
        return codec_for(spec)
    except ValueError as exc:
        raise ValueError(f"cannot load the tokenizer {spec!r}: {exc}") from None


def engine_api(client: EngineClient, asked: str, codec: Codec) -> EngineApi:
    """The interface to speak: the one asked for, or with "auto" the token interface where the engine
    serves it; ValueError when "tokens" is asked of an engine without it."""
    if asked not in ENGINE_APIS:
        raise ValueError(f"the engine API must be one of {', '.join(ENGINE_APIS)}, got {asked!r}")
    if asked == "completions":
        return COMPLETIONS
    if asked == "front":
        raise ValueError("--engine-api front speaks to fsched's vLLM front: give its URL as front://HOST:PORT")
    if client.serves(GENERATE_PATH):
        return tokens_api(codec.eos_token_ids)
    if asked == "tokens":
        raise ValueError(f"the engine does not serve its token interface ({GENERATE_PATH}): start vLLM "
                         "with --tokens-only (or --enable-scale-out), or use --engine-api completions")
    return COMPLETIONS


def connect_remote_engine(url: str, model: str | None, api: str = "auto", *, batch_stream_interval: int
                          ) -> RemoteEngine:
    """A runner over the engine at `url` (a batch request's tokens asked for `batch_stream_interval` a
    chunk); raises ValueError when it cannot be reached or used."""
    front = is_front_url(url)
    if front and api not in ("auto", "front"):
        raise ValueError(f"{url} is fsched's vLLM front: its engine API is front, not {api}")
    try:
        client = FrontClient(url) if front else EngineClient(url)
        info = client.info()
        name, codec = codec_for(model)
        chosen = front_api(codec.eos_token_ids) if front else engine_api(client, api, codec)
    except EngineHTTPError as exc:
        raise ValueError(str(exc)) from None
    context = min(codec.context_length, info.max_model_len or codec.context_length)
    codec = Codec(codec.decode, codec.eos_token_ids, context, codec.encode, codec.decode_special)
    log.info("engine %s serves %s (context %d, KV %s tokens, batch %s) over %s", client.url, info.model,
             context, info.kv_tokens or "unknown", info.max_num_seqs or "unknown", chosen.path or chosen.name)
    return RemoteEngine(
        runner=RemoteRunner(client, codec, info.model, api=chosen,
                            batch_stream_interval=batch_stream_interval),
        name=name,
        description=f"{name} on {client.url} ({info.model}, {chosen.name} API)", url=client.url,
        max_batch=info.max_num_seqs or DEFAULT_ENGINE_BATCH, kv_tokens=info.kv_tokens,
        step_tokens=ENGINE_STEP_TOKENS, min_quantum_steps=ENGINE_MIN_QUANTUM_STEPS, api=chosen.name,
    )
