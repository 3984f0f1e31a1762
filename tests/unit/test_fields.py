"""The field table against OpenAI's and vLLM's field lists: every request field of completions and
chat is honoured or refused by name, and at its neutral value every one is accepted and changes
nothing; a misspelt field is refused naming it."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.inputs import InputError
from fsched.core.openai.fields import FIELDS, Origin, Support, field_for, markdown_table
from fsched.core.openai.online import BodyError, ClassRefused, parse_online
from fsched.core.openai.responses import RESPONSES_FIELDS, to_chat_body
from fsched.core.types import Endpoint, RequestClass

CHAT, COMPLETIONS = Endpoint.CHAT, Endpoint.COMPLETIONS
# OpenAI's specification (openai/openai-openapi, openapi.json as of 2026-11): each request field of
# the two endpoints and the default it states (None where it states none).
SPEC_DEFAULTS = {
    COMPLETIONS: {
        "model": None, "prompt": "<|endoftext|>", "best_of": 1, "echo": False, "frequency_penalty": 0,
        "logit_bias": None, "logprobs": None, "max_tokens": 16, "n": 1, "presence_penalty": 0, "seed": None,
        "stop": None, "stream": False, "stream_options": None, "suffix": None, "temperature": 1, "top_p": 1,
        "user": None,
    },
    CHAT: {
        "metadata": None, "top_logprobs": None, "temperature": 1, "top_p": 1, "user": None,
        "safety_identifier": None, "prompt_cache_key": None, "prompt_cache_retention": None,
        "prompt_cache_options": None, "messages": None, "model": None, "service_tier": "auto",
        "modalities": None, "verbosity": "medium", "reasoning_effort": "medium",
        "max_completion_tokens": None, "frequency_penalty": 0, "presence_penalty": 0,
        "web_search_options": None, "response_format": None, "audio": None, "store": False,
        "moderation": None, "stream": False, "stop": None, "logit_bias": None, "logprobs": False,
        "max_tokens": None, "n": 1, "prediction": None, "seed": None, "stream_options": None, "tools": None,
        "tool_choice": None, "parallel_tool_calls": True, "function_call": None, "functions": None,
    },
}
# Fields whose spec default is a value to generate from, not a neutral one.
INPUTS = {"prompt", "messages", "model", "max_tokens", "input"}
# vLLM 0.32's request fields beyond OpenAI's (vllm.entrypoints.openai.*.protocol), with their defaults.
VLLM_DEFAULTS = {
    COMPLETIONS: {
        "use_beam_search": False, "top_k": None, "min_p": None, "repetition_penalty": None,
        "watermarking": None, "length_penalty": 1.0, "stop_token_ids": [],
        "include_stop_str_in_output": False, "ignore_eos": False, "min_tokens": 0,
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "truncate_prompt_tokens": None,
        "truncation_side": None, "allowed_token_ids": None, "prompt_logprobs": None,
        "logprob_token_ids": None, "bad_words": [], "prompt_embeds": None, "add_special_tokens": True,
        "response_format": None, "structured_outputs": None, "priority": 0, "request_id": "r",
        "session_id": None, "return_tokens_as_token_ids": None, "return_token_ids": None,
        "routed_experts_prompt_start": 0, "return_token_offsets": False, "mm_payload": "tensors",
        "return_mm_kwargs": None, "cache_salt": None, "kv_transfer_params": None,
        "ec_transfer_params": None, "vllm_xargs": None, "repetition_detection": None,
        "thinking_token_budget": None, "stream_interval": None,
    },
    CHAT: {
        "top_logprobs": 0, "tool_choice": "none", "thinking_token_budget": None, "include_reasoning": True,
        "use_beam_search": False, "top_k": None, "min_p": None, "repetition_penalty": None,
        "watermarking": None, "length_penalty": 1.0, "stop_token_ids": [],
        "include_stop_str_in_output": False, "ignore_eos": False, "min_tokens": 0,
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "truncate_prompt_tokens": None,
        "truncation_side": None, "prompt_logprobs": None, "logprob_token_ids": None,
        "allowed_token_ids": None, "bad_words": [], "echo": False, "add_generation_prompt": True,
        "continue_final_message": False, "add_special_tokens": False, "documents": None,
        "chat_template": None, "chat_template_kwargs": None, "media_io_kwargs": None,
        "mm_processor_kwargs": None, "structured_outputs": None, "priority": 0, "request_id": "r",
        "session_id": None, "return_tokens_as_token_ids": None, "return_token_ids": None,
        "routed_experts_prompt_start": 0, "return_token_offsets": False, "return_prompt_text": None,
        "mm_payload": "tensors", "return_mm_kwargs": None, "cache_salt": None, "kv_transfer_params": None,
        "ec_transfer_params": None, "vllm_xargs": None, "repetition_detection": None, "stream_interval": None,
    },
}
# A default that is not neutral in fsched's terms, and why.
NOT_NEUTRAL = {
    "priority": "vLLM's 0 is fsched's most urgent base priority (fsched's default is 5)",
    "request_id": "vLLM draws a random id",
}
BASE = {CHAT: {"messages": [{"role": "user", "content": "hi"}]}, COMPLETIONS: {"prompt": "hi"}}
# What a field's example needs beside it to be valid.
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
COMPANIONS = {"stream_options": {"stream": True}, "top_logprobs": {"logprobs": True},
              "tool_choice": {"tools": TOOLS},
              "parallel_tool_calls": {"tools": TOOLS, "tool_choice": "required"}}


def sdk_fields(module) -> set[str]:
    base = module.CompletionCreateParamsBase if hasattr(module, "CompletionCreateParamsBase") \
        else module.ResponseCreateParamsBase
    return set(typing.get_type_hints(base)) | {"stream"}


def key(request_class: RequestClass) -> ApiKey:
    return ApiKey("k1", "alice", request_class, "a key", "hash", 0.0)


def parse(endpoint: Endpoint, **fields):
    body = {**BASE[endpoint], **fields}
    return parse_online(json.dumps(body), endpoint, key(RequestClass.REALTIME))


def outcome(online) -> tuple:
    return (online.specs, online.request_class, online.job.priority, online.stream, online.stream_options)


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_every_field_of_the_spec_and_the_sdk_and_vllm_is_in_the_table(endpoint):
    module = completion_create_params if endpoint is COMPLETIONS else chat_create_params
    names = set(SPEC_DEFAULTS[endpoint]) | sdk_fields(module) | set(VLLM_DEFAULTS[endpoint])
    missing = sorted(n for n in names if field_for(n, endpoint) is None)
    assert missing == []
    for name, default in {**SPEC_DEFAULTS[endpoint], **VLLM_DEFAULTS[endpoint]}.items():
        spec = field_for(name, endpoint)
        if name not in INPUTS and name not in NOT_NEUTRAL and spec.support is not Support.HINT:
            assert spec.is_neutral(default), (name, default)
    vllm_only = {f.name for f in FIELDS if f.origin is Origin.VLLM and endpoint in f.endpoints}
    assert vllm_only <= set(VLLM_DEFAULTS[endpoint]) | {"response_format"}


def cases() -> list:
    return [pytest.param(f, endpoint, id=f"{endpoint.name.lower()}-{f.name}")
            for f in FIELDS for endpoint in sorted(f.endpoints)]


@pytest.mark.parametrize(("field", "endpoint"), cases())
def test_a_neutral_value_is_accepted_and_changes_nothing(field, endpoint):
    if field.name in BASE[endpoint]:
        return
    base = outcome(parse(endpoint))
    for value in (None, *field.neutral):
        assert outcome(parse(endpoint, **{field.name: value})) == base, value


@pytest.mark.parametrize(("field", "endpoint"), cases())
def test_any_other_value_is_honoured_or_refused_by_name(field, endpoint):
    companions = COMPANIONS.get(field.name, {})
    if field.support in (Support.SUPPORTED, Support.HINT):
        asked = outcome(parse(endpoint, **companions, **{field.name: field.example}))
        unasked = outcome(parse(endpoint, **companions))
        if field.support is Support.SUPPORTED:  # honoured: the request is another one
            assert asked != unasked
        else:  # a hint: any value, and nothing changes
            assert asked == unasked
        return
    with pytest.raises(BodyError) as refused:
        parse(endpoint, **{field.name: field.example})
    assert not isinstance(refused.value, ClassRefused)
    assert refused.value.field == field.name and field.note in refused.value.message
    assert refused.value.message.startswith(field.name + ":")


@pytest.mark.parametrize(("endpoint", "typo", "meant"), [
    (CHAT, "temprature", "temperature"), (CHAT, "max_token", "max_tokens"), (COMPLETIONS, "stops", "stop"),
    (CHAT, "presense_penalty", "presence_penalty"), (COMPLETIONS, "logprob", "logprobs"),
])
def test_a_misspelt_field_is_refused_naming_it_and_the_likely_one(endpoint, typo, meant):
    with pytest.raises(BodyError) as refused:
        parse(endpoint, **{typo: 1})
    assert refused.value.field == typo and f"did you mean {meant!r}" in refused.value.message


def test_every_responses_field_of_the_sdk_is_in_its_table_and_neutral_values_pass():
    names = {f.name for f in RESPONSES_FIELDS}
    assert sorted(sdk_fields(response_create_params) - names) == []
    def asked(**fields):
        chat = to_chat_body({"input": "hi", **fields}).chat_body
        return outcome(parse_online(json.dumps(chat), CHAT, key(RequestClass.REALTIME)))

    base = asked()
    for f in RESPONSES_FIELDS:
        if f.name == "input":
            continue
        for value in (None, *f.neutral):
            assert asked(**{f.name: value}) == base, (f.name, value)
        if f.support in (Support.NEUTRAL, Support.REFUSED):
            with pytest.raises(InputError) as refused:
                to_chat_body({"input": "hi", f.name: f.example})
            assert refused.value.field == f.name
        else:
            to_chat_body({"input": "hi", f.name: f.example})


def test_the_docs_show_the_tables_as_the_code_has_them():
    """docs/http.md shows both tables as `markdown_table` renders them (regenerate the page's tables
    from it when a field changes)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    assert markdown_table() in text
    assert markdown_table(RESPONSES_FIELDS, endpoints=False) in text
