"""The sampling fields on a remote engine: what fsched sends (vLLM's names, a resume's adjustments),
the logprobs it reads back, and structured output kept valid across a preemption by a replay."""

from __future__ import annotations

import json

import jsonschema
import pytest

from fsched.core.runners.openai_http import EngineClient
from fsched.core.runners.remote import (
    COMPLETIONS,
    Codec,
    EngineApi,
    RemoteRunner,
    completion_body,
    event_logprobs,
)
from fsched.core.runners.standin import STANDIN_EOS, standin_text
from fsched.core.runners.tokens_api import tokens_api
from fsched.core.sched.plan import Plan, Preemption, PrefillChunk
from fsched.core.sched.request import Checkpoint, Request
from fsched.core.types import LOGPROB_FLOOR, ResponseFormat, SamplingParams
from tests.support.fake_engine import FakeEngine

pytestmark = pytest.mark.timeout(120)
# The engine interfaces the wire cases run over: the completions and the token interface.
both_apis = pytest.mark.parametrize("api", ["completions", "tokens"])


def api_of(name: str, codec: Codec) -> EngineApi:
    return COMPLETIONS if name == "completions" else tokens_api(codec.eos_token_ids)

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_the_body_carries_each_field_in_vllms_names():
    p = SamplingParams(max_tokens=20, temperature=0.5, seed=4, presence_penalty=0.5, frequency_penalty=0.25,
                       repetition_penalty=1.2, min_p=0.1, min_tokens=5, ignore_eos=True,
                       stop_token_ids=(9,), logit_bias=((3, 2.0),), logprobs=2,
                       response_format=ResponseFormat.json_schema(SCHEMA, name="x", strict=True))
    body = completion_body("m", [1, 2], p, 0, 100)
    assert {k: body[k] for k in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                                 "min_tokens", "ignore_eos", "stop_token_ids", "logit_bias", "logprobs",
                                 "return_tokens_as_token_ids")} == {
        "presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.2, "min_p": 0.1,
        "min_tokens": 5, "ignore_eos": True, "stop_token_ids": [9], "logit_bias": {"3": 2.0}, "logprobs": 2,
        "return_tokens_as_token_ids": True}
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    plain = completion_body("m", [1, 2], SamplingParams(max_tokens=20), 0, 100)
    assert set(plain) == {"model", "prompt", "max_tokens", "temperature", "top_p", "stream",
                          "return_token_ids"}


def test_a_resume_sends_what_is_left_and_the_penalties_earned_as_bias():
    p = SamplingParams(max_tokens=20, min_tokens=5, presence_penalty=0.5, frequency_penalty=1.0,
                       logit_bias=((7, 1.0),))
    body = completion_body("m", [1, 2, 7, 7, 8], p, 3, 100, output=(7, 7, 8))
    assert body["max_tokens"] == 17 and body["min_tokens"] == 2
    # token 7 twice: 1.0 - 2 * 1.0 - 0.5; token 8 once: -1.0 - 0.5
    assert body["logit_bias"] == {"7": -1.5, "8": -1.5}
    done = completion_body("m", [1] * 8, p, 6, 100, output=(3,) * 6)
    assert "min_tokens" not in done and done["logit_bias"]["3"] == -6.5


def test_logprobs_read_from_a_completions_chunk():
    raw = {"tokens": ["token_id:5"], "token_logprobs": [-0.5],
           "top_logprobs": [{"token_id:5": -0.5, "token_id:9": -0.25, "token_id:1": None}]}
    (record,) = event_logprobs(raw, 1, lambda ids: f"<{ids[0]}>", 2)
    assert (record.chosen.token, record.chosen.logprob, record.chosen.text) == (5, -0.5, "<5>")
    assert [(t.token, t.logprob) for t in record.top] == [(9, -0.25), (5, -0.5)]
    (missing,) = event_logprobs(None, 1, str, 2)
    assert missing.chosen.logprob == LOGPROB_FLOOR and missing.top == ()


def one_request(runner: RemoteRunner, params: SamplingParams, preempt_at: int | None,
                prompt=(4, 5, 6)) -> tuple[list[int], list]:
    """Run one request to its end, preempted (its stream aborted, KV dropped) at `preempt_at` tokens."""
    a = Request.to_run("a", list(prompt), params)
    runner.add(a)
    runner.run(Plan(step=0, prefill=(PrefillChunk("a", 0, len(prompt), True),)))
    step = 1
    while "a" not in runner.run(Plan(step=step, decode=("a",))).finished:
        step += 1
        if len(a.output) >= (preempt_at or 1 << 30):
            preempt_at = None
            runner.run(Plan(step=step, preempted=(Preemption("a", Checkpoint.RECOMPUTE, 0),)))
    return a.output, a.output_logprobs


@pytest.fixture
def fake():
    engine = FakeEngine(step_s=0.001)
    yield engine
    engine.stop()


@both_apis
def test_logprobs_and_stop_fields_come_through_a_preemption(fake, api):
    codec = Codec(standin_text, frozenset({STANDIN_EOS}), 8192)
    params = SamplingParams(max_tokens=30, temperature=0, seed=3, logprobs=2, ignore_eos=True)

    def run(preempt_at: int | None):
        runner = RemoteRunner(EngineClient(fake.url), codec, fake.model, api=api_of(api, codec))
        return one_request(runner, params, preempt_at)

    tokens, logprobs = run(None)
    assert len(tokens) == 30 and len(logprobs) == 30 and all(len(t.top) == 2 for t in logprobs)
    assert [t.chosen.token for t in logprobs] == tokens
    assert run(5) == (tokens, logprobs)
    assert set(fake.apis) == {api}


def test_the_fronts_logprobs_and_chunks_are_the_token_interfaces(fake):
    """fsched's vLLM front (its server over a stand-in engine core) passes the engine's logprobs on in the
    token interface's shape and holds a batch request's tokens to its chunks itself: what the daemon reads
    is what it reads over the token interface, with and without a preemption."""
    from fsched.core.runners.front_link import FrontClient
    from fsched.core.runners.tokens_api import front_api
    from tests.support.fake_front import FakeFront

    codec = Codec(standin_text, frozenset({STANDIN_EOS}), 8192)
    front = FakeFront(step_s=0.001)
    try:
        for params in (SamplingParams(max_tokens=30, temperature=0, seed=3, logprobs=2, ignore_eos=True),
                       SamplingParams(max_tokens=30, temperature=0.7, seed=5, logprobs=0)):
            for preempt_at in (None, 5):
                over_http = RemoteRunner(EngineClient(fake.url), codec, fake.model,
                                         api=api_of("tokens", codec), batch_stream_interval=4)
                over_front = RemoteRunner(FrontClient(front.url), codec, front.model,
                                          api=front_api(codec.eos_token_ids), batch_stream_interval=4)
                expected = one_request(over_http, params, preempt_at)
                assert len(expected[0]) == 30 and len(expected[1]) == 30
                assert one_request(over_front, params, preempt_at) == expected
        assert {b.get("stream_interval") for b in front.bodies} == {4}
    finally:
        front.stop()


@pytest.fixture
def json_engine():
    from fsched.core.runners.hf.model import ensure_tiny_model

    folder = ensure_tiny_model()
    engine = FakeEngine(step_s=0.005, vocab=2000, eos=2, tokenizer=str(folder))
    yield engine, folder
    engine.stop()


@both_apis
def test_structured_output_on_the_engine_stays_valid_through_preemptions(json_engine, api):
    from fsched.core.runners.hf.tokenizer import load_tokenizer

    engine, folder = json_engine
    tok = load_tokenizer(str(folder))
    codec = Codec(tok.decode, tok.eos_token_ids, tok.context_length)
    fmt = ResponseFormat.json_schema(SCHEMA)
    for seed in range(2 if api == "tokens" else 4):
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, response_format=fmt)
        whole, _ = one_request(RemoteRunner(EngineClient(engine.url), codec, engine.model,
                                            api=api_of(api, codec)), params, None)
        jsonschema.validate(json.loads(tok.decode(whole)), SCHEMA)
        engine.bodies.clear()
        runner = RemoteRunner(EngineClient(engine.url), codec, engine.model, api=api_of(api, codec))
        again, _ = one_request(runner, params, preempt_at=3)
        assert again == whole and runner.resumes == 1
        # The resumed stream replayed from the prompt, under the grammar, with the first seed.
        first, resumed = engine.bodies
        assert resumed["prompt"] == first["prompt"] == [4, 5, 6] and resumed["seed"] == first["seed"]
        assert resumed["response_format"]["json_schema"]["schema"] == SCHEMA


def test_a_replay_that_diverges_fails_the_request_alone(json_engine):
    from fsched.core.runners.hf.tokenizer import load_tokenizer

    engine, folder = json_engine
    tok = load_tokenizer(str(folder))
    codec = Codec(tok.decode, tok.eos_token_ids, tok.context_length)
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=1,
                            response_format=ResponseFormat.json_schema(SCHEMA))
    runner = RemoteRunner(EngineClient(engine.url), codec, engine.model)
    whole, _ = one_request(runner, params, None)
    runner.release("a")
    runner.add(Request.to_run("a", [4, 5, 6], params, resumed=[whole[0] + 1]))  # not what the engine makes
    runner.run(Plan(step=0, prefill=(PrefillChunk("a", 0, 4, True),)))
    result = runner.run(Plan(step=1, decode=("a",)))
    while not result.failed:
        result = runner.run(Plan(step=2, decode=("a",)))
    assert "did not regenerate the output" in result.failed["a"]
