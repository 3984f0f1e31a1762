"""Answers read through a model folder's own response template (transformers' `response_template`):
whole, streamed split anywhere, with the prompt opening the reasoning; chosen by `--tool-call-parser
auto` when the `--tokenizer` folder carries one, and refused when transformers refuses it.

The template (tests/support/templates/response_template.json) writes calls as `<call>{json}</call>`
and reasoning as `<reason>...</reason>`, a syntax no known family has: only the template reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsched.cli.common import UserError
from fsched.cli.serve import _tool_parser
from fsched.core.openai.toolcalls import template
from fsched.core.openai.toolcalls.message import ReadingStream, message_of
from fsched.core.openai.toolcalls.reading import ReadOptions, read
from fsched.core.runners.hf.response_template import template_events
from fsched.core.types import AnswerOptions

SPEC = json.loads((Path(__file__).parents[1] / "support" / "templates" / "response_template.json")
                  .read_text())
ARGS = '{"city": "Paris", "days": [1, 2]}'
TEXT = ('<reason>Look it up.</reason>Let me check.\n'
        f'<call>{{"name": "weather", "arguments": {ARGS}}}</call>\n'
        '<call>{"name": "time", "arguments": {}}</call>')
CALLS = [("weather", ARGS), ("time", "{}")]


@pytest.fixture(scope="module")
def parser() -> str:
    return template.register(SPEC, template_events(SPEC, template.REASONING))


def calls_of(reading):
    return [(c.name, c.arguments) for c in reading.finished_calls()]


def test_the_template_reads_reasoning_content_and_calls_whole(parser):
    reading = read(TEXT, True, ReadOptions(tools=True, parser=parser))
    assert (reading.reasoning, reading.content, calls_of(reading)) == ("Look it up.", "Let me check.", CALLS)
    assert read(TEXT, True, ReadOptions(tools=True)).calls == ()  # no known family reads this syntax
    message, called = message_of(TEXT, AnswerOptions(tools=("weather", "time"), tool_parser=parser), "c", 0)
    assert called and message["reasoning_content"] == "Look it up." and message["content"] == "Let me check."


def test_a_stream_split_anywhere_joins_into_the_whole_answer_and_leaks_no_call(parser):
    options = ReadOptions(tools=True, parser=parser)
    for cut in range(0, len(TEXT) + 1, 3):
        stream = ReadingStream("chatcmpl-1", 0, options)
        parts = [stream.step(TEXT[:cut], False), stream.step(TEXT, False), stream.step(TEXT, True)]
        assert "".join(p[0] for p in parts) == "Look it up.", cut
        assert "".join(p[1] for p in parts) == "Let me check.", cut
        calls: dict[int, list[str]] = {}
        for d in (d for p in parts for d in p[2]):
            entry = calls.setdefault(d["index"], ["", ""])
            entry[0] += d.get("function", {}).get("name", "")
            entry[1] += d.get("function", {}).get("arguments", "")
        assert [tuple(calls[i]) for i in sorted(calls)] == CALLS, cut


def test_character_by_character_no_marker_reaches_reasoning_or_content(parser):
    stream = ReadingStream("x", 0, ReadOptions(tools=True, parser=parser))
    parts = [stream.step(TEXT[:i], False) for i in range(len(TEXT) + 1)] + [stream.step(TEXT, True)]
    shown = "".join(p[0] + p[1] for p in parts)
    assert "<" not in shown and shown == "Look it up.Let me check."


def test_a_prompt_that_opened_the_reasoning_and_one_call_only(parser):
    reading = read("Hm.</reason>Done.", True, ReadOptions(tools=True, parser=parser, thinking=True))
    assert (reading.reasoning, reading.content) == ("Hm.", "Done.")
    assert calls_of(read(TEXT, True, ReadOptions(tools=True, parser=parser, one_call=True))) == CALLS[:1]


def test_broken_call_json_is_content_and_a_process_without_the_template_reads_as_auto(parser):
    broken = '<call>{"name": "weather", "arguments": {</call>'
    assert read(broken, True, ReadOptions(tools=True, parser=parser)).content == broken
    hermes = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert calls_of(read(hermes, True, ReadOptions(tools=True, parser="template:unknown"))) == [("f", "{}")]


def test_auto_takes_the_tokenizer_folder_s_response_template(tmp_path, parser):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"response_template": SPEC}))
    assert _tool_parser("auto", str(tmp_path)) == parser
    assert _tool_parser("hermes", str(tmp_path)) == "hermes"  # the operator's choice wins
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"response_template": {"fields": {}}}))
    with pytest.raises(UserError, match="response_template"):
        _tool_parser("auto", str(tmp_path))
