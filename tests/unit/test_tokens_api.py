"""The token interface's codec: the `/inference/v1/generate` body in vLLM's names, and its logprobs read
back exactly; its stream chunks read by the same parser as the completions ones."""

from __future__ import annotations

import json
import socket

from fsched.core.runners.remote import COMPLETIONS, completion_body
from fsched.core.runners.streams import HEAD, Stream, _plain_chunk, received
from fsched.core.runners.tokens_api import GENERATE_PATH, generate_body, generate_logprobs, tokens_api
from fsched.core.types import MAX_LOGPROBS, ResponseFormat, ResponseFormatType, SamplingParams

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def test_the_body_carries_the_completions_fields_as_vllm_sampling_params():
    p = SamplingParams(max_tokens=20, temperature=0.5, top_k=7, seed=4, presence_penalty=0.5,
                       frequency_penalty=0.25, repetition_penalty=1.2, min_p=0.1, min_tokens=5,
                       stop_token_ids=(9,), logit_bias=((3, 2.0),), logprobs=2,
                       response_format=ResponseFormat.json_schema(SCHEMA, name="x", strict=True))
    body = generate_body("m", [1, 2], p, 0, 100, eos=(2,))
    assert set(body) == {"model", "token_ids", "sampling_params", "stream"}
    assert (body["model"], body["token_ids"], body["stream"]) == ("m", [1, 2], True)
    completions = completion_body("m", [1, 2], p, 0, 100)
    sampling = body["sampling_params"]
    for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "logit_bias"):
        assert sampling[name] == completions[name], name
    assert sampling["detokenize"] is False  # nothing to detokenize, even on a server with its tokenizer
    assert sampling["stop_token_ids"] == [2, 9]  # the model's EOS travels: the engine may not know it
    assert sampling["logprobs"] == 3  # one more than asked (see generate_logprobs)
    assert sampling["structured_outputs"] == {"json": SCHEMA}
    for name in ("prompt", "return_token_ids", "return_tokens_as_token_ids", "response_format", "stop"):
        assert name not in sampling, name


def test_eos_is_not_a_stop_under_ignore_eos_and_logprobs_stay_within_the_cap():
    p = SamplingParams(max_tokens=5, ignore_eos=True, logprobs=MAX_LOGPROBS)
    sampling = generate_body("m", [1], p, 0, 100, eos=(2,))["sampling_params"]
    assert "stop_token_ids" not in sampling and sampling["ignore_eos"] is True
    assert sampling["logprobs"] == MAX_LOGPROBS
    chosen_only = generate_body("m", [1], SamplingParams(max_tokens=5, logprobs=0), 0, 100)
    assert chosen_only["sampling_params"]["logprobs"] == 0
    fmt = ResponseFormat(ResponseFormatType.JSON_OBJECT)
    json_object = generate_body("m", [1], SamplingParams(max_tokens=5, response_format=fmt), 0, 100)
    assert json_object["sampling_params"]["structured_outputs"] == {"json_object": True}


def test_a_resume_sends_what_is_left_the_penalties_earned_and_the_resume_seed():
    p = SamplingParams(max_tokens=20, min_tokens=5, temperature=1.0, seed=11, frequency_penalty=1.0)
    resumed = generate_body("m", [1, 2, 7, 7, 8], p, 3, 100, output=(7, 7, 8))
    expected = completion_body("m", [1, 2, 7, 7, 8], p, 3, 100, output=(7, 7, 8))
    sampling = resumed["sampling_params"]
    assert resumed["token_ids"] == [1, 2, 7, 7, 8]
    assert (sampling["max_tokens"], sampling["min_tokens"]) == (17, 2)
    assert sampling["logit_bias"] == expected["logit_bias"] == {"7": -2.0, "8": -1.0}
    assert sampling["seed"] == expected["seed"] != 11


def test_logprobs_keep_the_k_likeliest_when_the_sampled_token_is_not_among_them():
    # vLLM's order: the sampled token (rank 4 here) first, then the candidates by rank, cut to the
    # count asked (k + 1 = 3): the two likeliest are both there.
    raw = {"content": [{"token_id": 5, "logprob": -2.0, "rank": 4, "top_logprobs": [
        {"token_id": 5, "logprob": -2.0, "rank": 4}, {"token_id": 9, "logprob": -0.25, "rank": 1},
        {"token_id": 1, "logprob": -0.5, "rank": 2}]}]}
    (record,) = generate_logprobs([(raw, 1)], lambda ids: f"<{ids[0]}>", 2)
    assert (record.chosen.token, record.chosen.logprob, record.chosen.text) == (5, -2.0, "<5>")
    assert [(t.token, t.logprob) for t in record.top] == [(9, -0.25), (1, -0.5)]
    (among,) = generate_logprobs([({"content": [{"token_id": 9, "logprob": -0.25, "top_logprobs": [
        {"token_id": 9, "logprob": -0.25}, {"token_id": 1, "logprob": -0.5},
        {"token_id": 3, "logprob": -0.75}]}]}, 1)], str, 2)
    assert [t.token for t in among.top] == [9, 1]
    (missing,) = generate_logprobs([(None, 1)], str, 2)
    assert missing.chosen.token == -1 and missing.top == ()


def test_the_token_interface_is_its_own_path_and_codec():
    api = tokens_api({2})
    assert (api.name, api.path) == ("tokens", GENERATE_PATH) != (COMPLETIONS.name, COMPLETIONS.path)
    body = api.body("m", [1], SamplingParams(max_tokens=3), 0, 100)
    assert body["sampling_params"]["stop_token_ids"] == [2]


def _chunk(tokens: list[int], finish: str | None) -> bytes:
    """A token interface chunk as vLLM 0.32 writes it."""
    return json.dumps({"request_id": "generate-tokens-1", "usage": None, "output_mode": "tokens",
                       "choices": [{"index": 0, "finish_reason": finish, "stop_reason": None,
                                    "token_ids": tokens, "routed_experts": None, "sampling_mask": None,
                                    "weight_versions": None, "logprobs": None}]}).encode()


def test_its_chunks_read_as_the_completions_ones():
    assert _plain_chunk(_chunk([4, 5], None)) == ([4, 5], None)
    assert _plain_chunk(_chunk([], "stop")) == ([], "stop")  # vLLM always sends the terminal chunk
    stream = Stream(socket.socket(), b"", state=HEAD)
    stream.sock.close()
    received(stream, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(
        b"data: " + c + b"\n\n" for c in (_chunk([4], None), _chunk([5], "length"))) + b"data: [DONE]\n\n")
    assert (stream.tokens, stream.finish, stream.error) == ([4, 5], "length", None)
