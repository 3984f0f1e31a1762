"""Validation of submitted JSONL files: every good form, every bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsched.core.jobs.jobfile import JobFileError
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.types import Endpoint


def lines(*objs) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objs).encode()


def nested_line(depth: int) -> bytes:
    """A line whose object nests `depth` levels (the object itself is level 1)."""
    inner = depth - 1
    return ('{"prompt": "a", "x": ' + "[" * inner + "]" * inner + "}").encode()


def error_of(data: bytes, limits: InputLimits = InputLimits()) -> JobFileError:
    with pytest.raises(JobFileError) as info:
        parse_job_file(data, "jobs.jsonl", limits)
    return info.value


def test_simple_form_prompt_and_messages():
    parsed = parse_job_file(
        lines(
            {"prompt": "Summarise this.", "max_tokens": 64, "custom_id": "a1", "temperature": 0},
            {"messages": [{"role": "user", "content": "Hi"}], "seed": 7, "stop": "\n"},
        ),
        "jobs.jsonl",
    )
    first, second = parsed
    assert first.custom_id == "a1" and first.prompt == "Summarise this."
    assert first.endpoint is Endpoint.COMPLETIONS
    assert first.params.max_tokens == 64 and first.params.greedy
    assert second.custom_id == "request-2"  # generated from its position
    assert second.endpoint is Endpoint.CHAT and second.messages[0].content == "Hi"
    assert second.params.seed == 7 and second.params.stop == ("\n",)
    assert second.params.max_tokens == InputLimits().default_max_tokens


def test_openai_batch_form():
    parsed = parse_job_file(
        lines(
            {
                "custom_id": "r1",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "gpt-x",
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
                    ],
                    "max_completion_tokens": 20,
                },
            },
            {
                "custom_id": "r2",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": "Once", "max_tokens": 5, "top_p": 0.9},
            },
        ),
        "batch.jsonl",
    )
    chat, completion = parsed
    assert chat.model == "gpt-x" and chat.params.max_tokens == 20
    assert chat.messages[1].content == "Hello"
    assert completion.endpoint is Endpoint.COMPLETIONS and completion.params.top_p == 0.9


def test_default_max_tokens_applies_to_lines_without_one():
    parsed = parse_job_file(
        lines({"prompt": "a"}, {"prompt": "b", "max_tokens": 3}), "f", default_max_tokens=9
    )
    assert [r.params.max_tokens for r in parsed] == [9, 3]


def test_bom_crlf_and_blank_lines_are_accepted():
    data = b"\xef\xbb\xbf" + b'{"prompt": "a"}\r\n\r\n   \n{"prompt": "b"}\r\n'
    assert [r.prompt for r in parse_job_file(data, "f")] == ["a", "b"]


OPENAI_OK = {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}


def test_a_batch_file_names_the_first_line_that_asks_for_another_endpoint_once_every_line_parsed():
    many = {**OPENAI_OK, "custom_id": "a", "body": {"prompt": ["p", "q"], "n": 3}}  # six requests
    other = {**OPENAI_OK, "custom_id": "b", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": "hi"}]}}
    data = lines(many, {**many, "custom_id": "c"}, other, {**other, "custom_id": "d"})
    with pytest.raises(JobFileError) as info:
        parse_job_file(data, "batch.jsonl", endpoint=Endpoint.COMPLETIONS)
    assert (info.value.line, info.value.field) == (3, "url")
    assert info.value.message == "asks for /v1/chat/completions; this batch's endpoint is /v1/completions"
    assert len(parse_job_file(data, "batch.jsonl")) == 14  # a file without a batch may mix them
    broken = data + b'{"custom_id": "e", "prompt": "simple form"}\n'
    with pytest.raises(JobFileError) as info:  # a line that does not parse is named first
        parse_job_file(broken, "batch.jsonl", endpoint=Endpoint.COMPLETIONS)
    assert info.value.line == 5 and "mixes the simple form" in info.value.message

BAD_INPUTS = [
    # (name, file bytes, expected line, expected field or None, text in the message)
    ("invalid json", b'{"prompt": "a"}\n{"prompt": \n', 2, None, "invalid JSON"),
    ("not an object", b'{"prompt": "a"}\n[1, 2]\n', 2, None, "JSON object"),
    ("missing prompt", lines({"max_tokens": 5}), 1, "prompt", "missing"),
    ("prompt and messages", lines({"prompt": "a", "messages": []}), 1, "prompt", "not both"),
    ("prompt not a string", lines({"prompt": 5}), 1, "prompt", "string"),
    ("empty prompt", lines({"prompt": ""}), 1, "prompt", "empty"),
    ("max_tokens wrong type", lines({"prompt": "a", "max_tokens": "10"}), 1, "max_tokens", "integer"),
    ("max_tokens zero", lines({"prompt": "a", "max_tokens": 0}), 1, "max_tokens", "within"),
    ("max_tokens negative", lines({"prompt": "a", "max_tokens": -3}), 1, "max_tokens", "within"),
    ("max_tokens absurd", lines({"prompt": "a", "max_tokens": 10**12}), 1, "max_tokens", "within"),
    ("max_tokens bool", lines({"prompt": "a", "max_tokens": True}), 1, "max_tokens", "integer"),
    ("temperature too high", lines({"prompt": "a", "temperature": 3}), 1, "temperature", "within"),
    ("top_p zero", lines({"prompt": "a", "top_p": 0}), 1, "top_p", "within"),
    ("seed over 64 bits", lines({"prompt": "a", "seed": 2**64}), 1, "seed", "within"),
    ("stop wrong type", lines({"prompt": "a", "stop": [1]}), 1, "stop", "string"),
    ("unknown field", lines({"prompt": "a", "max_token": 5}), 1, "max_token", "unknown field"),
    ("messages empty", lines({"messages": []}), 1, "messages", "non-empty"),
    (
        "message role",
        lines({"messages": [{"role": "robot", "content": "x"}]}),
        1,
        "messages[0].role",
        "one of",
    ),
    (
        "message content",
        lines({"messages": [{"role": "user", "content": 3}]}),
        1,
        "messages[0].content",
        "string",
    ),
    ("custom_id not string", lines({"prompt": "a", "custom_id": 5}), 1, "custom_id", "string"),
    (
        "duplicate custom_id",
        lines({"prompt": "a", "custom_id": "x"}, {"prompt": "b", "custom_id": "x"}),
        2,
        "custom_id",
        "first on line 1",
    ),
    ("empty file", b"", None, None, "no requests"),
    ("blank file", b"\n  \n\r\n", None, None, "no requests"),
    ("invalid utf-8", b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n', 2, None, "UTF-8"),
    (
        "unsupported url",
        lines({**OPENAI_OK, "url": "/v1/embeddings"}),
        1,
        "url",
        "unsupported url",
    ),
    ("unsupported method", lines({**OPENAI_OK, "method": "GET"}), 1, "method", "only"),
    (
        "openai without body",
        lines({"custom_id": "x", "method": "POST", "url": "/v1/completions"}),
        1,
        "body",
        "missing",
    ),
    (
        "openai url/body mismatch",
        lines({**OPENAI_OK, "url": "/v1/chat/completions"}),
        1,
        "body.prompt",
        "/v1/completions takes it",
    ),
    ("openai n 0", lines({**OPENAI_OK, "body": {"prompt": "p", "n": 0}}), 1, "body.n", "within"),
    ("openai n 200", lines({**OPENAI_OK, "body": {"prompt": ["p", "q"], "n": 100}}), 1, "body.n",
     "at most 128 choices"),
    ("a refused field", lines({**OPENAI_OK, "body": {"prompt": "p", "suffix": "x"}}), 1, "body.suffix",
     "insertion"),
    ("a chat field on completions", lines({**OPENAI_OK, "body": {"prompt": "p", "tools": []}}), 1,
     "body.tools", "/v1/chat/completions takes it"),
    ("mixed forms", lines(OPENAI_OK, {"prompt": "a"}), 2, None, "one form per file"),
    ("NaN", b'{"prompt": "a", "temperature": NaN}\n', 1, None, "finite"),
    ("Infinity", b'{"prompt": "a", "top_p": -Infinity}\n', 1, None, "finite"),
    ("nesting 65", nested_line(65), 1, None, "nested deeper"),
    ("nesting 100k", ("[" * 100_000 + "]" * 100_000).encode(), 1, None, "nested deeper"),
    ("huge integer", b'{"prompt": "a", "seed": ' + b"9" * 5000 + b"}", 1, None, "invalid JSON"),
    # Found by tests/chaos/test_fuzz.py:
    ("role unhashable", lines({"messages": [{"role": [], "content": "x"}]}), 1, "messages[0].role", "one of"),
    ("lone surrogate", b'{"prompt": "a\\ud800"}', 1, "prompt", "lone surrogate"),
    ("NUL in custom_id", b'{"prompt": "a", "custom_id": "x\\u0000"}', 1, "custom_id", "NUL"),
    (
        "NUL in content part",
        lines({"messages": [{"role": "user", "content": [{"type": "text", "text": "\0"}]}]}),
        1,
        "messages[0].content[0].text",
        "NUL",
    ),
    ("surrogate in stop", b'{"prompt": "a", "stop": ["\\udfff"]}', 1, "stop", "lone surrogate"),
    ("duplicate key", b'{"prompt": "a", "prompt": "b"}', 1, "prompt", "duplicate key"),
    ("float overflow", b'{"prompt": "a", "temperature": 1e400}', 1, "temperature", "finite"),
    ("stream", lines({**OPENAI_OK, "body": {"prompt": "p", "stream": True}}), 1, "body.stream",
     "an HTTP request's own"),
    ("n true", lines({**OPENAI_OK, "body": {"prompt": "p", "n": True}}), 1, "body.n", "an integer"),
    (
        "max_completion_tokens wrong type",
        lines({**OPENAI_OK, "body": {"prompt": "p", "max_tokens": 3, "max_completion_tokens": "x"}}),
        1,
        "body.max_completion_tokens",
        "integer",
    ),
    (
        "max_tokens and max_completion_tokens differ",
        lines({**OPENAI_OK, "body": {"prompt": "p", "max_tokens": 3, "max_completion_tokens": 4}}),
        1,
        "body.max_completion_tokens",
        "differs",
    ),
]


@pytest.mark.parametrize(
    ("data", "line", "field", "text"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_names_line_and_field(data, line, field, text):
    error = error_of(data)
    assert error.line == line
    assert error.field == field
    assert text in str(error)
    assert str(error).startswith("jobs.jsonl")
    assert "\n" not in str(error)


def test_error_messages_are_one_printable_line_whatever_the_input():
    # Field names, values and file names come from the user: a newline or a
    # terminal escape in them must not reach the terminal raw.
    error = error_of(b'{"prompt": "a", "x\\n\\u001b[2Jy": 1}')
    assert error.field == "x\n\x1b[2Jy"  # the attribute keeps the real name
    assert "field 'x\\n\\x1b[2Jy'" in str(error) and str(error).isprintable()
    long_url = lines({**OPENAI_OK, "url": "/v1/" + "x" * 10_000})
    assert len(str(error_of(long_url))) < 300
    with pytest.raises(JobFileError) as info:
        parse_job_file(b"", "evil\nname\x1b.jsonl")
    assert str(info.value).isprintable()


def test_only_an_omitted_max_tokens_is_a_default():
    simple = parse_job_file(lines({"prompt": "a"}, {"prompt": "b", "max_tokens": 9}), "f")
    assert [(r.params.max_tokens, r.params.max_tokens_is_default) for r in simple] == [
        (InputLimits().default_max_tokens, True),
        (9, False),
    ]
    body = {"prompt": "c", "max_completion_tokens": 7}
    (openai,) = parse_job_file(lines({**OPENAI_OK, "body": body}), "f")
    assert (openai.params.max_tokens, openai.params.max_tokens_is_default) == (7, False)


def test_nesting_limit_is_exactly_64():
    # At 64 levels the depth check passes and the line fails on its unknown field.
    assert "unknown field" in str(error_of(nested_line(64)))
    assert "nested deeper than 64" in str(error_of(nested_line(65)))


def test_limits_on_lines_bytes_and_line_bytes():
    small = InputLimits(max_lines=2, max_bytes=1000, max_line_bytes=100)
    assert "more than 2 requests" in str(error_of(lines(*[{"prompt": "a"}] * 3), small))
    assert error_of(lines(*[{"prompt": "a"}] * 3), small).line == 3
    long_line = lines({"prompt": "a" * 200})
    assert "over the limit of 100" in str(error_of(long_line, small))
    assert "over the limit of 1,000" in str(error_of(b" " * 1001, small))


def test_limits_from_env():
    limits = InputLimits.from_env({"FSCHED_MAX_LINES": "7"})
    assert limits.max_lines == 7
    with pytest.raises(ValueError, match="FSCHED_MAX_BYTES must be an integer"):
        InputLimits.from_env({"FSCHED_MAX_BYTES": "lots"})
    with pytest.raises(ValueError, match="must be >= 1"):
        InputLimits(max_lines=0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_accepted_or_rejected_cleanly(data):
    try:
        parsed = parse_job_file(data, "f")
    except JobFileError as error:
        assert "\n" not in str(error)
    else:
        assert parsed


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "prompt",
                "messages",
                "max_tokens",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "custom_id",
                "body",
                "url",
                "method",
                "top_k",
            ]
        ),
        json_values,
        max_size=6,
    )
)
def test_arbitrary_objects_are_accepted_or_rejected_cleanly(obj):
    data = json.dumps(obj).encode()
    try:
        parsed = parse_job_file(data, "f")
    except JobFileError as error:
        assert error.line in (1, None)
    else:  # one request a line, or several: a completions prompt may be a list of prompts
        assert parsed and all(spec.params.max_tokens >= 1 for spec in parsed)


def pieces_of(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_a_file_read_in_pieces_parses_as_the_whole_file():
    from fsched.core.openai.batchfile import parse_job_pieces

    data = b"\xef\xbb\xbf" + lines({"prompt": "a\u00e9b", "custom_id": "x"}, {"prompt": "c" * 50},
                                   {"messages": [{"role": "user", "content": "hi"}]}) + b"\n\n"
    whole = parse_job_file(data, "jobs.jsonl")
    for size in (1, 2, 3, 7, 64, len(data)):  # lines and characters split over pieces
        assert parse_job_pieces(pieces_of(data, size), "jobs.jsonl") == whole


def test_a_file_in_pieces_is_refused_as_soon_as_it_is_over_a_limit():
    from fsched.core.openai.batchfile import parse_job_pieces

    small = InputLimits(max_lines=2, max_bytes=1000, max_line_bytes=100)
    read = []

    def pieces(data: bytes):
        for piece in pieces_of(data, 10):
            read.append(piece)
            yield piece

    with pytest.raises(JobFileError) as error:  # a line with no end, over the limit: stops there
        parse_job_pieces(pieces(lines({"prompt": "a"}) + b'{"prompt": "' + b"a" * 5000), "f", small)
    assert "over the limit of 100" in str(error.value) and error.value.line == 2
    assert sum(map(len, read)) < 200
    read.clear()
    with pytest.raises(JobFileError) as error:
        parse_job_pieces(pieces(b" \n" * 3000), "f", small)
    assert "over the limit of 1,000 bytes" in str(error.value) and sum(map(len, read)) <= 1010



def test_a_chat_line_with_tools_is_read_in_the_parser_named():
    """`fsched submit --tool-call-parser` and a server's Batch API store the parser with each line."""
    from fsched.cli.common import UserError
    from fsched.cli.common import known_tool_parser as _parser

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    line = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    data = (json.dumps(line) + "\n").encode()
    (spec,) = parse_job_file(data, "in.jsonl", tool_parser=_parser("mistral"))
    assert (spec.answer.tools, spec.answer.tool_parser) == (("f",), "mistral")
    assert parse_job_file(data, "in.jsonl")[0].answer.tool_parser == "auto"
    with pytest.raises(UserError, match="--tool-call-parser"):
        _parser("nope")
