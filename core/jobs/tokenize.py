"""vLLM's /tokenize and /detokenize bodies in fsched's terms: pure checks, no tokenizer.

A prompt is encoded as a completions request's is, messages through the
model's chat template as a chat request's are, so /tokenize counts exactly
the tokens a request would bring (the prompt_tokens of its usage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.limits import InputLimits
from fsched.core.jobs.shapes import messages as checked_messages
from fsched.core.jobs.values import INT64, BadValue, Boolean, Text, integer, json_type, same_value, storable
from fsched.core.types import ChatMessage

# Fields vLLM defines that change what is encoded: fsched takes their neutral values only.
_NEUTRAL = {
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "tools": ([],),
    "media_io_kwargs": ({},),
    "mm_processor_kwargs": ({},),
}
MAX_DETOKENIZE = 1_000_000


class TokenizeProblem(ValueError):
    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(slots=True, frozen=True)
class TokenizeRequest:
    prompt: str | None
    messages: tuple[ChatMessage, ...]
    token_strs: bool


def parse_tokenize(body: dict, limits: InputLimits = InputLimits()) -> TokenizeRequest:
    """{model?, prompt} or {model?, messages, ...}; every field checked, none ignored."""
    if ("prompt" in body) == ("messages" in body):
        raise TokenizeProblem("prompt", "give either 'prompt' (text) or 'messages' (chat), not both")
    prompt, messages, token_strs = None, (), False
    for key, value in body.items():
        try:
            if key == "prompt":
                prompt = storable(_text(value))
            elif key == "messages":
                messages = checked_messages(value, limits)
            elif key == "return_token_strs":
                token_strs = value is not None and Boolean().check(value, limits)
            elif key == "model" and value is not None:
                Text(256).check(value, limits)
            elif key == "model":
                pass
            elif key == "add_special_tokens":
                # vLLM's defaults: a prompt gets the tokenizer's special tokens, messages only the
                # template's; fsched encodes as its requests are encoded, so only these.
                if value is not None and not same_value(value, "prompt" in body):
                    raise BadValue(f"only {json.dumps('prompt' in body)} here: fsched encodes as its "
                                   "requests are encoded")
            elif key in _NEUTRAL:
                if value is not None and not any(same_value(value, n) for n in _NEUTRAL[key]):
                    raise BadValue("fsched encodes as its requests are encoded (the model's chat "
                                   "template, its tokenizer's defaults): only the neutral value")
            else:
                raise BadValue("unknown field")
        except BadValue as exc:
            raise TokenizeProblem(key + exc.where, exc.message) from None
    return TokenizeRequest(prompt, messages, token_strs)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise BadValue(f"must be a string, got {json_type(value)}")
    return value


def parse_detokenize(body: dict) -> list[int]:
    """{model?, tokens: [int, ...]}."""
    for key in body:
        if key not in ("model", "tokens"):
            raise TokenizeProblem(key, "unknown field (accepted: model, tokens)")
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise TokenizeProblem("tokens", f"must be an array of token ids, got {json_type(tokens)}")
    if len(tokens) > MAX_DETOKENIZE:
        raise TokenizeProblem("tokens", f"at most {MAX_DETOKENIZE:,} token ids")
    try:
        return [integer(t, 0, INT64 - 1, f"[{i}]") for i, t in enumerate(tokens)]
    except BadValue as exc:
        raise TokenizeProblem("tokens" + exc.where, exc.message) from None
