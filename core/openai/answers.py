"""Answers in OpenAI's shapes: whole `chat.completion` / `text_completion` objects and stream chunks.

Pure: a request's choices (text, finish reason, token ids, logprobs, as the
job table holds them) in, JSON-ready dicts out. Used by the online handlers,
by `fsched results` and by the Batch API's output files, so an answer reads
the same whichever door it leaves by.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass

from fsched.core.openai.toolcalls.message import finish_reason, message_of
from fsched.core.types import AnswerOptions, Endpoint, TokenLogprobs

_PAD = string.ascii_letters + string.digits


@dataclass(slots=True, frozen=True)
class AnswerChoice:
    """One choice of an answer as the table holds it."""

    index: int
    text: str
    finish_reason: str | None = None
    num_tokens: int = 0
    prompt_tokens: int | None = None
    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] = ()
    prompt: str | None = None  # a completions choice's prompt (echo shows it)


def response_id(endpoint: Endpoint, request_id: int | str) -> str:
    return f"chatcmpl-{request_id}" if endpoint is Endpoint.CHAT else f"cmpl-{request_id}"


def opaque_response_id(endpoint: Endpoint) -> str:
    """An online answer's id: random, so ids tell nothing of how many requests anyone made."""
    return response_id(endpoint, secrets.token_hex(12))


def opaque_responses_id() -> str:
    """A Responses API answer's id (OpenAI's `resp_` form), random as the others."""
    return f"resp_{secrets.token_hex(24)}"


def usage(choices: Sequence[AnswerChoice], answer: AnswerOptions) -> dict:
    """Prompt tokens once a prompt (the first choice of each), completion tokens of every choice."""
    prompt = sum(c.prompt_tokens or 0 for c in choices if c.index % answer.n == 0)
    completion = sum(c.num_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def response_body(endpoint: Endpoint, answer_id: str, created: int, model: str,
                  choices: Sequence[AnswerChoice], answer: AnswerOptions = AnswerOptions(),
                  prompt_token_ids: Sequence | None = None) -> dict:
    """A whole answer: one entry a choice, by index, and the usage summed over them."""
    body = {"id": answer_id, "object": "chat.completion" if endpoint is Endpoint.CHAT else "text_completion",
            "created": created, "model": model,
            "choices": [_whole_choice(endpoint, c, answer, answer_id)
                        for c in sorted(choices, key=lambda c: c.index)],
            "usage": usage(choices, answer)}
    if answer.token_ids:
        body["prompt_token_ids"] = _prompt_ids(prompt_token_ids, answer)
    return body


def _whole_choice(endpoint: Endpoint, c: AnswerChoice, answer: AnswerOptions, answer_id: str) -> dict:
    reason = c.finish_reason or "stop"
    echoed = c.prompt if answer.echo and c.prompt else ""
    if endpoint is Endpoint.CHAT:
        message, calls = message_of(c.text, answer, answer_id, c.index)
        out = {"index": c.index, "message": message,
               "logprobs": chat_logprobs(c.logprobs, answer) if answer.logprobs else None,
               "finish_reason": finish_reason(reason, calls)}
    else:
        lp = completion_logprobs(c.logprobs, answer, len(echoed)) if answer.logprobs else None
        out = {"index": c.index, "text": echoed + c.text, "logprobs": lp, "finish_reason": reason}
    if answer.token_ids:
        out["token_ids"] = list(c.tokens)
    return out


def _prompt_ids(prompt_token_ids: Sequence | None, answer: AnswerOptions) -> list | None:
    """vLLM's prompt_token_ids: the prompt's ids (a list of them a prompt when a body has several)."""
    if prompt_token_ids is None:
        return None
    ids = [list(p) for p in prompt_token_ids]
    return ids[0] if answer.prompts == 1 else ids


def _token_name(lp_token: int, text: str, answer: AnswerOptions) -> str:
    return f"token_id:{lp_token}" if answer.tokens_as_ids else text


def chat_logprobs(logprobs: Sequence[TokenLogprobs], answer: AnswerOptions) -> dict:
    """Chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}."""
    def entry(token: int, logprob: float, text: str) -> dict:
        name = _token_name(token, text, answer)
        return {"token": name, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = [{**entry(t.chosen.token, t.chosen.logprob, t.chosen.text),
                "top_logprobs": [entry(a.token, a.logprob, a.text) for a in t.top]} for t in logprobs]
    return {"content": content, "refusal": None}


def completion_logprobs(logprobs: Sequence[TokenLogprobs], answer: AnswerOptions, offset: int = 0) -> dict:
    """Completions' `logprobs`: parallel arrays of tokens, their logprobs, the top alternatives of
    each (a token -> logprob object) and each token's offset in the text."""
    tokens, values, tops, offsets = [], [], [], []
    for t in logprobs:
        tokens.append(_token_name(t.chosen.token, t.chosen.text, answer))
        values.append(t.chosen.logprob)
        top = {_token_name(a.token, a.text, answer): a.logprob for a in t.top}
        top.setdefault(tokens[-1], t.chosen.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(t.chosen.text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


# -- streams ------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Delta:
    """What one chunk carries for one choice: new text, its tokens' logprobs, or the end."""

    index: int
    text: str = ""
    logprobs: tuple[TokenLogprobs, ...] = ()
    tokens: tuple[int, ...] = ()
    first: bool = False  # chat: the chunk that opens the assistant's turn (role)
    finish_reason: str | None = None
    text_offset: int = 0  # completions: where `text` starts in the whole text
    reasoning: str = ""  # chat: new reasoning text (reasoning_content)
    tool_calls: tuple[dict, ...] = ()  # chat: call fragments, by index


def chunk(endpoint: Endpoint, answer_id: str, created: int, model: str, delta: Delta,
          answer: AnswerOptions = AnswerOptions(), include_usage: bool = False,
          obfuscation: bool = False, usage_so_far: dict | None = None) -> dict:
    """One streamed chunk: new text of one choice, or (with `finish_reason`) its last chunk.

    With `include_usage` every chunk carries `usage: null` (OpenAI's convention)
    and the usage comes in a last chunk of its own (`usage_chunk`); vLLM's
    continuous usage (`usage_so_far`) puts the figures so far in each chunk.
    """
    if endpoint is Endpoint.CHAT:
        choice = {"index": delta.index, "delta": _chat_delta(delta),
                  "logprobs": chat_logprobs(delta.logprobs, answer) if answer.logprobs else None,
                  "finish_reason": delta.finish_reason}
        kind = "chat.completion.chunk"
    else:
        lp = completion_logprobs(delta.logprobs, answer, delta.text_offset) if answer.logprobs else None
        choice = {"index": delta.index, "text": delta.text, "logprobs": lp,
                  "finish_reason": delta.finish_reason}
        kind = "text_completion"
    if answer.token_ids:
        choice["token_ids"] = list(delta.tokens)
    out = {"id": answer_id, "object": kind, "created": created, "model": model, "choices": [choice]}
    if usage_so_far is not None:
        out["usage"] = usage_so_far
    elif include_usage:
        out["usage"] = None
    if obfuscation:
        out["obfuscation"] = padding()
    return out


def _chat_delta(delta: Delta) -> dict:
    if delta.first:
        return {"role": "assistant", "content": delta.text}
    out: dict = {}
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    if delta.text or not (delta.reasoning or delta.tool_calls or delta.finish_reason is not None):
        out["content"] = delta.text
    if delta.tool_calls:
        out["tool_calls"] = list(delta.tool_calls)
    return out


def usage_chunk(endpoint: Endpoint, answer_id: str, created: int, model: str, usage_figures: dict) -> dict:
    kind = "chat.completion.chunk" if endpoint is Endpoint.CHAT else "text_completion"
    return {"id": answer_id, "object": kind, "created": created, "model": model, "choices": [],
            "usage": usage_figures}


def padding() -> str:
    """OpenAI's stream obfuscation: 1 to 16 random characters, so a chunk's size tells nothing of its
    text's."""
    return "".join(secrets.choice(_PAD) for _ in range(1 + secrets.randbelow(16)))
