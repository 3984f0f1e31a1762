"""vLLM's /tokenize and /detokenize bodies in fsched's terms: pure checks, no tokenizer.

A prompt is encoded as a completions request's is, messages through the
model's chat template as a chat request's are (with its tools and
chat_template_kwargs), so /tokenize counts exactly
the tokens a request would bring (the prompt_tokens of its usage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.inputs import InputError, json_type, storable
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai import shapes
from fsched.core.openai.messages import messages as checked_messages
from fsched.core.openai.values import INT64, Boolean, Text, integer, same_value
from fsched.core.types import ChatMessage, ChatRender

# Fields vLLM defines that change what is encoded: fsched takes their neutral values only.
_NEUTRAL = {
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "media_io_kwargs": ({},),
    "mm_processor_kwargs": ({},),
}
MAX_DETOKENIZE = 1_000_000


@dataclass(slots=True, frozen=True)
class TokenizeRequest:
    prompt: str | None
    messages: tuple[ChatMessage, ...]
    token_strs: bool
    render: ChatRender = ChatRender()  # the tools and template options, as a chat request's


def parse_tokenize(body: dict, limits: InputLimits = InputLimits()) -> TokenizeRequest:
    """{model?, prompt} or {model?, messages, ...}; every field checked, none ignored."""
    if ("prompt" in body) == ("messages" in body):
        raise InputError("give either 'prompt' (text) or 'messages' (chat), not both", "prompt")
    prompt, messages, token_strs, tools, kwargs = None, (), False, (), {}
    for key, value in body.items():
        try:
            if key == "prompt":
                prompt = storable(_text(value))
            elif key == "messages":
                messages = checked_messages(value, limits)
            elif key == "tools" and value is not None:
                tools = shapes.tools(value, limits)
            elif key == "chat_template_kwargs" and value is not None:
                kwargs = shapes.template_kwargs(value, limits)
            elif key in ("tools", "chat_template_kwargs"):
                pass
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
                    raise InputError(f"only {json.dumps('prompt' in body)} here: fsched encodes as its "
                                   "requests are encoded")
            elif key in _NEUTRAL:
                if value is not None and not any(same_value(value, n) for n in _NEUTRAL[key]):
                    raise InputError("fsched encodes as its requests are encoded (the model's chat "
                                   "template, its tokenizer's defaults): only the neutral value")
            else:
                raise InputError("unknown field")
        except InputError as exc:
            raise exc.within(key) from None
    return TokenizeRequest(prompt, messages, token_strs, ChatRender(tools, tuple(sorted(kwargs.items()))))


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {json_type(value)}")
    return value


def parse_detokenize(body: dict) -> list[int]:
    """{model?, tokens: [int, ...]}."""
    for key in body:
        if key not in ("model", "tokens"):
            raise InputError("unknown field (accepted: model, tokens)", key)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise InputError(f"must be an array of token ids, got {json_type(tokens)}", "tokens")
    if len(tokens) > MAX_DETOKENIZE:
        raise InputError(f"at most {MAX_DETOKENIZE:,} token ids", "tokens")
    try:
        return [integer(t, 0, INT64 - 1, f"[{i}]") for i, t in enumerate(tokens)]
    except InputError as exc:
        raise exc.within("tokens") from None
