"""Every request field of /v1/completions and /v1/chat/completions, and what fsched does with it.

One table, from which the body parser (`body.py`), its refusals, the
field table of docs/http.md and the tests that walk OpenAI's and vLLM's
field lists all derive. A field is

- supported: honoured (its `note` says how);
- a hint: a value that by its definition asks for no change of the answer
  (an end-user id, a cache routing key): any valid value is accepted;
- neutral only: its neutral values (null, the spec's default, and those in
  `neutral`) are accepted, any other is refused with the `note` as the reason;
- refused: only null is accepted.

A field the table does not name is a 400 "unknown field" naming it; one it
names for the other endpoint says so. `online` fields (streaming, the class
and the priority) are the HTTP request's own: in a batch line they take
their neutral values only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from fsched.core.openai import messages, shapes
from fsched.core.openai.values import (
    INT64,
    Boolean,
    Custom,
    Integer,
    Kind,
    LogitBias,
    Number,
    Seed,
    Stop,
    Text,
    TokenIds,
    same_value,
)
from fsched.core.types import MAX_LOGPROBS, Endpoint


class Support(enum.StrEnum):
    SUPPORTED = "supported"
    HINT = "accepted (a hint)"
    NEUTRAL = "neutral only"
    REFUSED = "refused"


class Origin(enum.StrEnum):
    OPENAI = "OpenAI"
    VLLM = "vLLM"


C, H = frozenset({Endpoint.COMPLETIONS}), frozenset({Endpoint.CHAT})
BOTH = C | H


@dataclass(slots=True, frozen=True)
class BodyField:
    name: str
    endpoints: frozenset[Endpoint]
    support: Support
    note: str  # supported: what fsched does with it; otherwise why it cannot honour another value
    kind: Kind | None = None  # how a supported or hinted value is checked
    neutral: tuple[Any, ...] = ()  # values, besides null, that change nothing
    origin: Origin = Origin.OPENAI
    online: bool = False  # the HTTP request's own: a batch line takes the neutral values only
    example: Any = None  # a valid value that is not neutral: the tests send it

    def __post_init__(self) -> None:
        takes_values = self.support in (Support.SUPPORTED, Support.HINT)
        if takes_values != (self.kind is not None):
            raise ValueError(f"{self.name}: a kind exactly when the field takes values")
        if self.example is None or self.is_neutral(self.example):
            raise ValueError(f"{self.name}: the example must be a value that is not neutral")

    def is_neutral(self, value: Any) -> bool:
        return value is None or any(same_value(value, n) for n in self.neutral)


def _f(name: str, endpoints: frozenset[Endpoint], support: Support, note: str, **kw: Any) -> BodyField:
    return BodyField(name, endpoints, support, note, **kw)


S, HINT, N, R = Support.SUPPORTED, Support.HINT, Support.NEUTRAL, Support.REFUSED
V = Origin.VLLM
_PROB = Number(0.0, 1.0)
_PENALTY = Number(-2.0, 2.0)
_CACHE_HINT = ("routes requests to OpenAI's prompt cache; fsched has no such router (a remote engine "
               "caches prefixes by itself)")
_TEXT_ONLY = "fsched serves text generation only"
_OLD_FUNCTIONS = "the deprecated functions are not taken: send tools (and tool_choice)"
# The sampler draws safely at any accepted value (core/runners/hf/sampling.py): say how.
TEMPERATURE_TEXT = "sampling temperature; 0 is greedy; above 0 and below 0.01, sampled at 0.01 (vLLM's floor)"
TOP_P_TEXT = "nucleus sampling; however small, the likeliest token is kept"

OPENAI_FIELDS = (
    _f("model", BOTH, S, "names the model in the answer; the daemons serve the model they loaded "
       "(GET /v1/models)", kind=Text(256), example="my-model"),
    _f("prompt", C, S, "the text to continue; an array of strings asks for an answer to each "
       "(choices by index, prompt by prompt)", kind=Custom(shapes.prompts, "string or array of strings"),
       example="Once upon a time"),
    _f("messages", H, S, "the conversation, rendered through the model's chat template; text content "
       "(a string or text parts) and a message's name", kind=Custom(messages.messages, "array of messages"),
       example=[{"role": "user", "content": "hello"}]),
    _f("max_tokens", BOTH, S, "the most tokens to generate (default: the room the model's context leaves, "
       "or the operator's default_max_tokens if lower; asked for and not fitting: a 400)",
       kind=Integer(1), example=7),
    _f("max_completion_tokens", BOTH, S, "the newer name of max_tokens (both at once must agree; fsched "
       "takes it on completions too)", kind=Integer(1), example=7),
    _f("temperature", BOTH, S, TEMPERATURE_TEXT, kind=Number(0.0, 2.0), neutral=(1,), example=0.5),
    _f("top_p", BOTH, S, TOP_P_TEXT, kind=Number(0.0, 1.0, low_open=True), neutral=(1,), example=0.9),
    _f("seed", BOTH, S, "the seed of every draw; each token's draw depends on (seed, position) only, so "
       "an answer replays after preemption and restarts (a negative seed is taken modulo 2^63)",
       kind=Seed(), example=42),
    _f("stop", BOTH, S, "up to 4 strings; the answer ends before the first one found",
       kind=Stop(), neutral=([],), example=["\n"]),
    _f("n", BOTH, S, "choices to generate for each prompt, each drawn with seed + its index (as vLLM); "
       "usage sums them", kind=Integer(1, 128), neutral=(1,), example=2),
    _f("stream", BOTH, S, "server-sent events as tokens are flushed", kind=Boolean(), neutral=(False,),
       online=True, example=True),
    _f("stream_options", BOTH, S, "include_usage: a last chunk with the usage; include_obfuscation: "
       "random padding in an obfuscation field of each chunk; vLLM's continuous_usage_stats: the usage "
       "so far in every chunk", kind=Custom(shapes.stream_options, "object"), online=True,
       example={"include_usage": True}),
    _f("presence_penalty", BOTH, S, "lowers the logits of tokens already generated, once each",
       kind=_PENALTY, neutral=(0,), example=0.5),
    _f("frequency_penalty", BOTH, S, "lowers the logits of tokens already generated, by their count",
       kind=_PENALTY, neutral=(0,), example=0.5),
    _f("logit_bias", BOTH, S, "adds a bias (-100..100) to the logits of the given token ids",
       kind=LogitBias(), neutral=({},), example={"5": 10}),
    _f("logprobs", C, S, "the chosen token's log probability and this many alternatives (0..20: "
       "OpenAI allows 5, vLLM 20)", kind=Integer(0, MAX_LOGPROBS), example=2),
    _f("logprobs", H, S, "log probabilities of the output tokens", kind=Boolean(), neutral=(False,),
       example=True),
    _f("top_logprobs", H, S, "alternatives shown with each token (0..20; needs logprobs)",
       kind=Integer(0, 20), neutral=(0,), example=3),
    _f("echo", C, S, "the prompt before the generated text (not with logprobs: fsched computes no "
       "log probabilities of the prompt)", kind=Boolean(), neutral=(False,), example=True),
    _f("response_format", H, S, "json_object: the answer is a JSON object; json_schema: it validates "
       "against the schema (a grammar constrains the sampling)",
       kind=Custom(shapes.response_format, "object"), neutral=({"type": "text"},),
       example={"type": "json_object"}),
    _f("service_tier", BOTH, S, "the class: priority is realtime, default streaming, flex batch, auto "
       "the key's own; never above the key's class (403)", kind=Text(16, ("auto", "default", "flex",
       "priority")), neutral=("auto",), online=True, example="flex"),
    _f("user", BOTH, HINT, "identifies the end user to OpenAI's abuse monitoring; fsched keeps none",
       kind=Text(), example="user-1"),
    _f("safety_identifier", H, HINT, "identifies the end user to OpenAI's safety systems; fsched keeps "
       "none", kind=Text(), example="user-1"),
    _f("prompt_cache_key", H, HINT, _CACHE_HINT, kind=Text(), example="k"),
    _f("prompt_cache_retention", H, HINT, _CACHE_HINT, kind=Text(16, ("in_memory", "24h")),
       example="24h"),
    _f("prompt_cache_options", H, HINT, _CACHE_HINT, kind=Custom(lambda v, _l: v, "object"),
       example={"ttl": "30m"}),
    _f("best_of", C, N, "fsched returns every choice it generates; choosing the best of more than n by "
       "log probability is not done", neutral=(1,), example=3),
    _f("suffix", C, N, "insertion (text after the completion) is not supported", neutral=("",),
       example="the end"),
    _f("store", H, N, "fsched keeps no chat completions for later retrieval", neutral=(False,),
       example=True),
    _f("metadata", H, N, "labels a stored chat completion; fsched stores none", neutral=({},),
       example={"team": "a"}),
    _f("modalities", H, N, _TEXT_ONLY, neutral=(["text"],), example=["text", "audio"]),
    _f("audio", H, R, _TEXT_ONLY, example={"voice": "alloy", "format": "wav"}),
    _f("verbosity", H, N, "the models fsched serves have no verbosity setting", neutral=("medium",),
       example="low"),
    _f("reasoning_effort", H, S, "given to the model's chat template as reasoning_effort (templates "
       "that take it use it; others ignore it, as with vLLM); medium, the default, is not passed",
       kind=Text(16, ("none", "minimal", "low", "medium", "high", "xhigh")), neutral=("medium",),
       example="high"),
    _f("prediction", H, R, "predicted outputs (speculative decoding against a known text) are not done",
       example={"type": "content", "content": "x"}),
    _f("web_search_options", H, R, "fsched has no web search", example={}),
    _f("moderation", H, R, "fsched runs no moderation model", example={"model": "omni-moderation"}),
    _f("tools", H, S, "function tools, given to the model's chat template; calls are read out of the "
       "answer by the model's own response template where its tokenizer carries one, else by the model "
       "family's syntax (docs/models.md)", kind=Custom(shapes.tools, "array of tools"),
       neutral=([],), example=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    _f("tool_choice", H, S, "none: no call is read; auto: the model decides; required or a named function: "
       "a grammar holds the answer to one call (or more, with parallel_tool_calls) whose arguments "
       "validate against the function's parameters", kind=Custom(shapes.tool_choice, "string or object"),
       neutral=("none", "auto"), example="required"),
    _f("parallel_tool_calls", H, S, "false: at most one call (a required call is held to one; with auto "
       "the first call the model wrote is the answer's)", kind=Boolean(), neutral=(True,), example=False),
    _f("functions", H, N, _OLD_FUNCTIONS, neutral=([],), example=[{"name": "f"}]),
    _f("function_call", H, N, _OLD_FUNCTIONS, neutral=("none", "auto"), example={"name": "f"}),
)

_NO_BEAM = "beam search is not implemented"
VLLM_FIELDS = (
    _f("top_k", BOTH, S, "sample among the k most likely tokens; 0 or -1: all", kind=Integer(-1, 1 << 30),
       neutral=(0, -1), origin=V, example=20),
    _f("min_p", BOTH, S, "drop tokens less likely than min_p times the most likely one", kind=_PROB,
       neutral=(0,), origin=V, example=0.1),
    _f("repetition_penalty", BOTH, S, "divides the positive logits (multiplies the negative) of tokens in "
       "the prompt or the output", kind=Number(0.0, 10.0, low_open=True), neutral=(1,), origin=V,
       example=1.2),
    _f("min_tokens", BOTH, S, "no end of sequence (nor stop token) before this many tokens",
       kind=Integer(0), neutral=(0,), origin=V, example=3),
    _f("ignore_eos", BOTH, S, "generate past the end-of-sequence token, up to max_tokens", kind=Boolean(),
       neutral=(False,), origin=V, example=True),
    _f("stop_token_ids", BOTH, S, "token ids that end the answer as the end-of-sequence token does",
       kind=TokenIds(), neutral=([],), origin=V, example=[5]),
    _f("include_stop_str_in_output", BOTH, S, "keep the stop string that ended the answer in its text",
       kind=Boolean(), neutral=(False,), origin=V, example=True),
    _f("skip_special_tokens", BOTH, S, "false: special tokens are decoded into the text too (default: true, "
       "but false for tool calls read as Mistral's, whose `[TOOL_CALLS]` is a special token)",
       kind=Boolean(), neutral=(True,), origin=V, example=False),
    _f("priority", BOTH, S, "fsched's base priority within the tenant's own work, 0 (most urgent) to 9, "
       "default 5; any other integer is clamped into 0..9 (vLLM's order: lower is earlier)",
       kind=Integer(-INT64, INT64 - 1), online=True, origin=V, example=2),
    _f("return_token_ids", BOTH, S, "the prompt's token ids (prompt_token_ids) and each choice's "
       "(token_ids) in the answer", kind=Boolean(), neutral=(False,), origin=V, example=True),
    _f("return_tokens_as_token_ids", BOTH, S, "logprobs name tokens as 'token_id:N'", kind=Boolean(),
       neutral=(False,), origin=V, example=True),
    _f("request_id", BOTH, HINT, "vLLM's id for its own logs; fsched names requests itself",
       kind=Text(), origin=V, example="r-1"),
    _f("session_id", BOTH, HINT, "vLLM's routing key for related requests; fsched routes by fairness",
       kind=Text(), origin=V, example="s-1"),
    _f("return_token_offsets", BOTH, HINT, "vLLM honours it only on its render endpoints, as fsched "
       "does (none)", kind=Boolean(), origin=V, example=True),
    _f("return_mm_kwargs", BOTH, HINT, "vLLM honours it only on its render endpoints, as fsched does "
       "(none)", kind=Boolean(), origin=V, example=False),
    _f("use_beam_search", BOTH, N, _NO_BEAM, neutral=(False,), origin=V, example=True),
    _f("length_penalty", BOTH, N, _NO_BEAM, neutral=(1,), origin=V, example=0.5),
    _f("watermarking", BOTH, N, "watermarking is not implemented", neutral=(False,), origin=V,
       example=True),
    _f("spaces_between_special_tokens", BOTH, N, "fsched decodes as the tokenizer does", neutral=(True,),
       origin=V, example=False),
    _f("truncate_prompt_tokens", BOTH, N, "a prompt too long for the model's context is refused, never "
       "cut", neutral=(-1,), origin=V, example=16),
    _f("truncation_side", BOTH, N, "a prompt is never cut", origin=V, example="left"),
    _f("allowed_token_ids", BOTH, R, "not implemented (logit_bias can favour tokens)", origin=V,
       example=[1, 2]),
    _f("prompt_logprobs", BOTH, R, "not implemented (echo with logprobs shows the prompt's tokens)",
       origin=V, example=1),
    _f("logprob_token_ids", BOTH, R, "not implemented (logprobs shows the most likely tokens)", origin=V,
       example=[1]),
    _f("bad_words", BOTH, N, "not implemented (logit_bias -100 bans single tokens)", neutral=([],),
       origin=V, example=["x"]),
    _f("prompt_embeds", C, R, "fsched takes text prompts only", origin=V, example="AAAA"),
    _f("add_special_tokens", C, N, "the prompt is encoded as the tokenizer does by default",
       neutral=(True,), origin=V, example=False),
    _f("add_special_tokens", H, N, "the chat template adds the special tokens", neutral=(False,),
       origin=V, example=True),
    _f("structured_outputs", BOTH, R, "use response_format (json_object or json_schema)", origin=V,
       example={"json": {}}),
    _f("response_format", C, R, "structured output is taken on chat completions (response_format there)",
       origin=V, neutral=({"type": "text"},), example={"type": "json_object"}),
    _f("routed_experts_prompt_start", BOTH, N, "fsched returns no expert routing", neutral=(0,), origin=V,
       example=4),
    _f("mm_payload", BOTH, N, _TEXT_ONLY, neutral=("tensors",), origin=V, example="urls"),
    _f("cache_salt", BOTH, R, "fsched does not salt a remote engine's prefix cache", origin=V,
       example="salt"),
    _f("kv_transfer_params", BOTH, R, "disaggregated prefill is not supported", origin=V, example={"a": 1}),
    _f("ec_transfer_params", BOTH, R, "disaggregated encoding is not supported", origin=V,
       example={"a": 1}),
    _f("vllm_xargs", BOTH, R, "fsched runs no custom sampling extensions", origin=V, example={"a": 1}),
    _f("repetition_detection", BOTH, R, "not implemented (max_tokens bounds a repeating answer)",
       origin=V, example={"max_pattern_size": 4}),
    _f("thinking_token_budget", BOTH, N, "the models fsched serves have no thinking budget",
       neutral=(-1,), origin=V, example=100),
    _f("stream_interval", BOTH, N, "fsched streams each batch of tokens as the daemon flushes it",
       neutral=(1,), origin=V, example=8),
    _f("echo", H, N, "echoing the last message is not implemented", neutral=(False,), origin=V,
       example=True),
    _f("include_reasoning", H, N, "reasoning written as <think>...</think> (or as the model's own response "
       "template writes it) is always returned apart, as reasoning_content", neutral=(True,), origin=V,
       example=False),
    _f("add_generation_prompt", H, N, "the chat template always opens the assistant's turn",
       neutral=(True,), origin=V, example=False),
    _f("continue_final_message", H, N, "the answer is always a new assistant turn", neutral=(False,),
       origin=V, example=True),
    _f("documents", H, R, "the chat template is given messages only", origin=V, example=[{"text": "d"}]),
    _f("chat_template", H, R, "the model's own chat template is used", origin=V, example="{{ x }}"),
    _f("chat_template_kwargs", H, S, "given to the model's chat template (enable_thinking and the like); "
       "the names fsched sets itself (messages, tools, add_generation_prompt, ...) are refused",
       kind=Custom(shapes.template_kwargs, "object"), neutral=({},), origin=V,
       example={"enable_thinking": False}),
    _f("media_io_kwargs", H, N, _TEXT_ONLY, neutral=({},), origin=V, example={"video": {}}),
    _f("mm_processor_kwargs", H, N, _TEXT_ONLY, neutral=({},), origin=V, example={"a": 1}),
    _f("return_prompt_text", H, N, "the prompt's text after the chat template is not returned",
       neutral=(False,), origin=V, example=True),
)

FIELDS: tuple[BodyField, ...] = OPENAI_FIELDS + VLLM_FIELDS
_BY_KEY = {(f.name, e): f for f in FIELDS for e in f.endpoints}
if len(_BY_KEY) != sum(len(f.endpoints) for f in FIELDS):
    raise RuntimeError("a field is in the table twice for one endpoint")


def field_for(name: str, endpoint: Endpoint) -> BodyField | None:
    return _BY_KEY.get((name, endpoint))


def names_for(endpoint: Endpoint) -> list[str]:
    return sorted(name for name, e in _BY_KEY if e is endpoint)


def other_endpoint(name: str, endpoint: Endpoint) -> Endpoint | None:
    """The endpoint that takes `name` when this one does not."""
    other = Endpoint.CHAT if endpoint is Endpoint.COMPLETIONS else Endpoint.COMPLETIONS
    return other if (name, other) in _BY_KEY else None


REQUIRED = ("prompt", "messages", "input")


def markdown_table(fields: tuple[BodyField, ...] = FIELDS, endpoints: bool = True) -> str:
    """The field table as docs/http.md shows it (a test keeps the page equal to this)."""
    head = "| field | endpoint | origin | fsched | neutral values | what it does, or why not |"
    rule = "|---|---|---|---|---|---|"
    if not endpoints:
        head, rule = head.replace(" endpoint | origin |", ""), rule[:-8]
    rows = [head, rule]
    for f in sorted(fields, key=lambda f: (f.origin != Origin.OPENAI, f.name, sorted(f.endpoints))):
        where = "both" if len(f.endpoints) == 2 else ", ".join(
            "chat" if e is Endpoint.CHAT else "completions" for e in f.endpoints)
        neutral = ", ".join(f"`{_json(v)}`" for v in (None, *f.neutral))
        if f.support is Support.HINT:
            neutral = "any"
        elif f.name in REQUIRED:
            neutral = "(required)"
        cells = [f"`{f.name}`", where, f.origin.value] if endpoints else [f"`{f.name}`"]
        cells += [f.support.value, neutral, f.note.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
