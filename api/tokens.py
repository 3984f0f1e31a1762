"""vLLM's /tokenize and /detokenize, and the prompt token ids an answer may carry.

The server encodes with the tokenizer of the model the daemons serve: the
stand-in's and the tiny model's are known by name; any other is the folder
`fsched serve --tokenizer` names (the daemons' tokenizer, so counts agree).
Loaded once, on first use, in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from fastapi import APIRouter, Request

from fsched.api.errors import ApiError
from fsched.api.limits import body_text
from fsched.api.state import ServerState, state_of
from fsched.core.jobs.inputs import InputError
from fsched.core.jobs.jsontext import loads_object
from fsched.core.openai.tokenize import parse_detokenize, parse_tokenize

router = APIRouter()


class TextCodec(Protocol):
    """What the endpoints need of a tokenizer (the runners' `Codec` is one)."""

    context_length: int

    def encode(self, prompt: str | None, messages: list[dict] | None, render: dict | None = None
               ) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


# (spec given to `fsched serve --tokenizer`, or None; the models the live daemons serve) -> the
# tokenizer's name and codec; ValueError, with a message for the client, when none can be had.
CodecLoader = Callable[[str | None, Sequence[str]], tuple[str, TextCodec]]


def _no_loader(_spec: str | None, _models: Sequence[str]) -> tuple[str, TextCodec]:
    raise ValueError("this server was started without a tokenizer")


class Tokenizers:
    """The server's codec of the served model (one, cached), loaded by what the composition root
    gives (the server never loads a model itself)."""

    def __init__(self, spec: str | None = None, load: CodecLoader = _no_loader):
        self.spec = spec
        self.load = load
        self._loaded: dict[tuple[str | None, tuple[str, ...]], tuple[str, TextCodec]] = {}
        self._lock = asyncio.Lock()

    async def codec(self, state: ServerState) -> tuple[str, TextCodec]:
        models: tuple[str, ...] = ()
        if self.spec is None:
            models = tuple(sorted({d.model for d in await state.live_daemons()}))
            if not models:
                await state.require_daemon()
        key = (self.spec, models)
        async with self._lock:
            if key not in self._loaded:
                self._loaded[key] = await state.call(self._load, self.spec, models)
        return self._loaded[key]

    def _load(self, spec: str | None, models: Sequence[str]) -> tuple[str, TextCodec]:
        try:
            return self.load(spec, models)
        except ValueError as exc:
            raise ApiError(400, str(exc), code="no_tokenizer") from None


async def prompt_token_ids(state: ServerState, prompt: str | None, messages: list[dict] | None) -> list[int]:
    _, codec = await state.tokenizers.codec(state)
    return await state.call(codec.encode, prompt, messages)


async def _body(request: Request, state: ServerState) -> dict:
    text = await body_text(request)
    try:
        return loads_object(text, (await state.limits()).max_depth)
    except InputError as exc:
        raise ApiError(400, exc.message, exc.field) from None


@router.post("/tokenize")
async def tokenize(request: Request) -> dict:
    state = state_of(request)
    await state.authenticate(request)
    try:
        asked = parse_tokenize(await _body(request, state), await state.limits())
    except InputError as exc:
        raise ApiError(400, exc.message, exc.field, "invalid_value") from None
    _, codec = await state.tokenizers.codec(state)
    messages = [m.to_json() for m in asked.messages] or None
    tokens = await state.call(codec.encode, asked.prompt, messages, asked.render.to_json())
    out = {"count": len(tokens), "max_model_len": codec.context_length, "tokens": tokens}
    out["token_strs"] = [codec.decode([t]) for t in tokens] if asked.token_strs else None
    return out


@router.post("/detokenize")
async def detokenize(request: Request) -> dict:
    state = state_of(request)
    await state.authenticate(request)
    try:
        tokens = parse_detokenize(await _body(request, state))
    except InputError as exc:
        raise ApiError(400, exc.message, exc.field, "invalid_value") from None
    _, codec = await state.tokenizers.codec(state)
    try:
        text = await state.call(codec.decode, tokens)
    except (ValueError, OverflowError, IndexError, TypeError) as exc:
        raise ApiError(400, f"these are not token ids of the model: {exc}", "tokens") from None
    return {"prompt": text}

