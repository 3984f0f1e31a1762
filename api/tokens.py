"""vLLM's /tokenize and /detokenize, and the prompt token ids an answer may carry.

The server encodes with the tokenizer of the model the daemons serve: the
stand-in's and the tiny model's are known by name; any other is the folder
`fsched serve --tokenizer` names (the daemons' tokenizer, so counts agree).
Loaded once, on first use, in a worker thread.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from fsched.api.errors import ApiError
from fsched.api.state import ServerState, state_of
from fsched.core.jobs.jobfile import JobFileError, load_json_object
from fsched.core.jobs.tokenize import TokenizeProblem, parse_detokenize, parse_tokenize
from fsched.core.runners.remote import Codec
from fsched.core.runners.standin import STANDIN_NAME

router = APIRouter()


class Tokenizers:
    """The server's codec of the served model (one, cached), found as the module doc says."""

    def __init__(self, spec: str | None = None):
        self.spec = spec
        self._loaded: dict[str, tuple[str, Codec]] = {}
        self._lock = asyncio.Lock()

    async def codec(self, state: ServerState) -> tuple[str, Codec]:
        spec = self.spec or await self._spec_of_daemons(state)
        async with self._lock:
            if spec not in self._loaded:
                self._loaded[spec] = await state.call(_load, spec)
        return self._loaded[spec]

    async def _spec_of_daemons(self, state: ServerState) -> str:
        models = sorted({d.model for d in await state.live_daemons()})
        if not models:
            await state.require_daemon()
        if models == [STANDIN_NAME]:
            return "standin"
        from fsched.core.runners.hf.model import TINY_MODEL_NAME

        if models == [TINY_MODEL_NAME]:
            return "tiny"
        raise ApiError(400, f"this server does not know the tokenizer of {', '.join(models)}: start "
                            "fsched serve with --tokenizer MODEL_FOLDER (the daemons' model)",
                       code="no_tokenizer")


def _load(spec: str) -> tuple[str, Codec]:
    from fsched.core.runners.connect import codec_for

    try:
        return codec_for(spec)
    except ValueError as exc:
        raise ApiError(400, f"cannot load the tokenizer {spec!r}: {exc}", code="no_tokenizer") from None


async def prompt_token_ids(state: ServerState, prompt: str | None, messages: list[dict] | None) -> list[int]:
    _, codec = await state.tokenizers.codec(state)
    return await state.call(codec.encode, prompt, messages)


async def _body(request: Request, state: ServerState) -> dict:
    raw = await request.body()
    try:
        return load_json_object(raw.decode("utf-8"), (await state.limits()).max_depth)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8") from None
    except JobFileError as exc:
        raise ApiError(400, exc.message, exc.field) from None


@router.post("/tokenize")
async def tokenize(request: Request) -> dict:
    state = state_of(request)
    await state.authenticate(request)
    try:
        asked = parse_tokenize(await _body(request, state), await state.limits())
    except TokenizeProblem as exc:
        raise ApiError(400, exc.message, exc.field, "invalid_value") from None
    _, codec = await state.tokenizers.codec(state)
    messages = [m.to_json() for m in asked.messages] or None
    tokens = await state.call(codec.encode, asked.prompt, messages)
    out = {"count": len(tokens), "max_model_len": codec.context_length, "tokens": tokens}
    out["token_strs"] = [codec.decode([t]) for t in tokens] if asked.token_strs else None
    return out


@router.post("/detokenize")
async def detokenize(request: Request) -> dict:
    state = state_of(request)
    await state.authenticate(request)
    try:
        tokens = parse_detokenize(await _body(request, state))
    except TokenizeProblem as exc:
        raise ApiError(400, exc.message, exc.field, "invalid_value") from None
    _, codec = await state.tokenizers.codec(state)
    try:
        text = await state.call(codec.decode, tokens)
    except (ValueError, OverflowError, IndexError, TypeError) as exc:
        raise ApiError(400, f"these are not token ids of the model: {exc}", "tokens") from None
    return {"prompt": text}

