"""vLLM's token interface: `POST /inference/v1/generate`, token ids in and out, no detokenizer.

vLLM serves it with `--tokens-only` (its API server then loads no tokenizer
and detokenizes nothing) or beside its OpenAI routes with
`--enable-scale-out`; elsewhere the path answers 403 (disabled) or 404 (an
engine without it). The request is `{"token_ids", "sampling_params", "model",
"stream"}`, `sampling_params` in vLLM's own names (`SamplingParams`); a
streamed answer is server-sent events whose one choice carries `token_ids`
and `finish_reason` (as the completions stream does with
`return_token_ids`), ending with `data: [DONE]`; an engine error is an
`error` event or a non-200 answer, and a client that disconnects aborts the
request, as on `/v1/completions`.

The body is the completions body (`completion_body`) moved into vLLM's
names, so both ways carry the same fields: what is left of max_tokens and
min_tokens on a resume, the penalties earned as logit_bias, the resume
seed. `response_format` becomes `structured_outputs`. `detokenize: false` is
sent always, so an engine that serves the path beside its OpenAI routes
skips the text as well. Stop strings are fsched's own (never sent). The
model's end-of-sequence ids travel as stop token ids (unless `ignore_eos`):
an engine without its tokenizer may not know them, and would otherwise
generate past the end until fsched sees it and aborts the stream.

Logprobs come as integer ids, the sampled token first and then the
candidates in rank order, cut to `max(k, 1)` entries in all: the sampled
token takes a place when it is not among the k likeliest, so fsched asks
for one more than the request's k and keeps the k likeliest, which is then
exact; at k = 20 (vLLM's cap) a sampled token outside the 20 likeliest
leaves 19 alternatives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial

from fsched.core.runners.remote import EngineApi, completion_body
from fsched.core.types import LOGPROB_FLOOR, MAX_LOGPROBS, Logprob, SamplingParams, TokenLogprobs

GENERATE_PATH = "/inference/v1/generate"
# Fields of the completions body that are the request's, not sampling parameters.
_REQUEST_FIELDS = ("model", "prompt", "stream", "return_token_ids", "return_tokens_as_token_ids",
                   "response_format", "logprobs")


def tokens_api(eos_token_ids: Iterable[int] = ()) -> EngineApi:
    """The token interface for a model whose end-of-sequence ids are `eos_token_ids`."""
    return EngineApi("tokens", GENERATE_PATH, partial(generate_body, eos=tuple(sorted(eos_token_ids))),
                     generate_logprobs, chunked_generate)


def front_api(eos_token_ids: Iterable[int] = ()) -> EngineApi:
    """fsched's front for vLLM's engine core (core/runners/vllm_front.py): this interface's requests and
    logprobs, every stream on one connection (core/runners/front_link.py)."""
    return EngineApi("front", "", partial(generate_body, eos=tuple(sorted(eos_token_ids))),
                     generate_logprobs, chunked_generate)


def chunked_generate(body: dict, n: int) -> dict:
    """A generate body whose stream sends `n` tokens a chunk after the first (a sampling parameter here)."""
    return {**body, "sampling_params": {**body["sampling_params"], "stream_interval": n}}


def generate_body(model: str, context: list[int], params: SamplingParams, generated: int,
                  context_length: int, output: Sequence[int] = (), eos: Sequence[int] = ()) -> dict:
    """The `/inference/v1/generate` request that continues a request from `context` (the arguments
    of `completion_body`; `eos`: the model's end-of-sequence ids)."""
    body = completion_body(model, context, params, generated, context_length, output)
    sampling = {k: v for k, v in body.items() if k not in _REQUEST_FIELDS}
    sampling["detokenize"] = False
    if eos and not params.ignore_eos:
        sampling["stop_token_ids"] = sorted({*sampling.get("stop_token_ids", ()), *eos})
    if params.logprobs is not None:
        sampling["logprobs"] = min(params.logprobs + 1, MAX_LOGPROBS) if params.logprobs else 0
    if (fmt := body.get("response_format")) is not None:
        sampling["structured_outputs"] = (
            {"json_object": True} if fmt["type"] == "json_object" else {"json": fmt["json_schema"]["schema"]})
    return {"model": model, "token_ids": body["prompt"], "sampling_params": sampling, "stream": True}


def generate_logprobs(chunks: Sequence[tuple[dict, int]], decode: Callable[[list[int]], str], top: int
                      ) -> list[TokenLogprobs]:
    """The logprobs of the tokens of several chunks, each (its `logprobs` object, its token count):
    `{"content": [{"token_id", "logprob", "top_logprobs": [{"token_id", "logprob"}, ...]}, ...]}`."""
    out: list[TokenLogprobs] = []
    for raw, count in chunks:
        content = (raw or {}).get("content") or []
        for i in range(count):
            entry = content[i] if i < len(content) else {}
            chosen = _logprob(entry, decode)
            offered = {c.get("token_id", -1): c for c in entry.get("top_logprobs") or ()}
            alternatives = sorted(offered.values(), key=lambda c: -_floor(c.get("logprob")))[:top]
            out.append(TokenLogprobs(chosen, tuple(_logprob(c, decode) for c in alternatives)))
    return out


def _logprob(entry: dict, decode: Callable[[list[int]], str]) -> Logprob:
    token = entry.get("token_id", -1)
    return Logprob(token, _floor(entry.get("logprob")), decode([token]) if token >= 0 else "")


def _floor(logprob: float | None) -> float:
    return LOGPROB_FLOOR if logprob is None or logprob != logprob else max(LOGPROB_FLOOR, float(logprob))
