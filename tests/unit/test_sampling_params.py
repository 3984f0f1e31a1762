"""SamplingParams: every field validated, stored as JSON and read back unchanged; logprob records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsched.core.types import (
    MAX_LOGPROBS,
    Logprob,
    ResponseFormat,
    ResponseFormatType,
    SamplingParams,
    TokenLogprobs,
)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_a_plain_request_stores_as_it_always_did():
    p = SamplingParams(max_tokens=16, temperature=0.5, seed=3)
    assert set(p.to_json()) == {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                                "max_tokens_is_default"}
    assert p.plain and not p.penalized


def test_a_row_stored_before_the_new_fields_reads_as_neutral():
    old = {"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 5, "stop": []}
    p = SamplingParams.from_json(old)
    assert p == SamplingParams(max_tokens=8, seed=5, max_tokens_is_default=True)
    assert p.logprobs is None and p.response_format is None and p.skip_special_tokens


def test_every_field_round_trips_through_json_text():
    p = SamplingParams(
        max_tokens=40, temperature=0.7, top_p=0.9, top_k=5, seed=11, stop=("END",),
        presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.3,
        logit_bias=SamplingParams.logit_bias_of({17: -100, 3: 2.5}), min_p=0.05, min_tokens=4,
        ignore_eos=True, stop_token_ids=(7, 9), include_stop_str_in_output=True,
        skip_special_tokens=False, logprobs=3,
        response_format=ResponseFormat.json_schema(SCHEMA, name="person", strict=True),
    )
    stored = json.loads(json.dumps(p.to_json()))  # what a JSON column gives back
    assert SamplingParams.from_json(stored) == p
    assert p.logit_bias == ((3, 2.5), (17, -100.0))
    assert stored["response_format"] == {"type": "json_schema", "schema": SCHEMA, "name": "person",
                                         "strict": True}
    assert not p.plain and p.penalized


@given(
    presence=st.floats(-2, 2), frequency=st.floats(-2, 2), repetition=st.floats(0.01, 5),
    min_p=st.floats(0, 1), logprobs=st.none() | st.integers(0, MAX_LOGPROBS),
    bias=st.dictionaries(st.integers(0, 200_000), st.floats(-100, 100), max_size=5),
    stops=st.lists(st.integers(0, 200_000), max_size=4, unique=True),
)
def test_round_trip_for_any_valid_values(presence, frequency, repetition, min_p, logprobs, bias, stops):
    p = SamplingParams(max_tokens=10, presence_penalty=presence, frequency_penalty=frequency,
                       repetition_penalty=repetition, min_p=min_p, logprobs=logprobs,
                       logit_bias=SamplingParams.logit_bias_of(bias), stop_token_ids=tuple(stops))
    assert SamplingParams.from_json(json.loads(json.dumps(p.to_json()))) == p


@pytest.mark.parametrize("fields, message", [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"logit_bias": ((5, 101.0),)}, "logit_bias"),
    ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
    ({"logit_bias": ((5, 1.0), (2, 1.0))}, "sorted"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": 11}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"stop_token_ids": (-3,)}, "stop_token_ids"),
    ({"logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
])
def test_values_out_of_range_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(max_tokens=10, **fields)


def test_response_formats():
    obj = ResponseFormat(ResponseFormatType.JSON_OBJECT)
    assert ResponseFormat.from_json(obj.to_json()) == obj and obj.schema_object is None
    # The same schema written with other key order or spacing is the same format.
    a = ResponseFormat.json_schema({"type": "object", "required": ["x"]})
    written = json.loads('{"required":["x"], "type":"object"}')
    b = ResponseFormat.from_json({"type": "json_schema", "schema": written})
    assert a == b and hash(a) == hash(b)
    for bad in (
        lambda: ResponseFormat(ResponseFormatType.TEXT),
        lambda: ResponseFormat(ResponseFormatType.JSON_SCHEMA),
        lambda: ResponseFormat(ResponseFormatType.JSON_OBJECT, schema="{}"),
        lambda: ResponseFormat(ResponseFormatType.JSON_SCHEMA, schema="[1]"),
    ):
        with pytest.raises(ValueError):
            bad()


def test_token_logprobs_round_trip_compactly():
    record = TokenLogprobs(Logprob(5, -0.25, " the"), (Logprob(5, -0.25, " the"), Logprob(9, -2.0, "\ufffd")))
    stored = json.loads(json.dumps(record.to_json()))
    assert stored == [5, -0.25, " the", [[5, -0.25, " the"], [9, -2.0, "\ufffd"]]]
    assert TokenLogprobs.from_json(stored) == record
