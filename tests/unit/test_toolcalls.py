"""Tool calls and reasoning read out of model text: each family, whole and split at every character."""

from __future__ import annotations

import json

import pytest

from fsched.core.openai.toolcalls.message import ReadingStream, call_id, message_of
from fsched.core.openai.toolcalls.reading import ReadOptions, read
from fsched.core.types import AnswerOptions

TOOLS = ReadOptions(tools=True)
ARGS = '{"city": "Paris", "days": [1, 2], "note": "a \\"quoted\\" }"}'

# family -> (text the model writes, content, [(name, arguments)])
CASES = {
    "hermes": (f'Let me look.\n<tool_call>\n{{"name": "weather", "arguments": {ARGS}}}\n</tool_call>\n'
               '<tool_call>{"name": "time", "arguments": {}}</tool_call>',
               "Let me look.", [("weather", ARGS), ("time", "{}")]),
    "llama3_json": (f'{{"name": "weather", "parameters": {ARGS}}}; {{"name": "time", "parameters": {{}}}}',
                    "", [("weather", ARGS), ("time", "{}")]),
    "llama3_python_tag": (f'<|python_tag|>{{"name": "weather", "parameters": {ARGS}}}', "",
                          [("weather", ARGS)]),
    "mistral_array": (f'[TOOL_CALLS] [{{"name": "weather", "arguments": {ARGS}}}, {{"name": "time", '
                      '"arguments": {}}]', "", [("weather", ARGS), ("time", "{}")]),
    "mistral_args": (f"[TOOL_CALLS]weather[ARGS]{ARGS}[TOOL_CALLS]time[ARGS]{{}}", "",
                     [("weather", ARGS), ("time", "{}")]),
    "string_arguments": ('<tool_call>{"name": "time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>', "",
                         [("time", '{"tz": "UTC"}')]),
    "plain": ("Just words, with a < and a [ and {braces}.", "Just words, with a < and a [ and {braces}.", []),
    "json_not_a_call": ('{"city": "Paris"}', '{"city": "Paris"}', []),
}


def calls_of(reading):
    return [(c.name, c.arguments) for c in reading.finished_calls()]


@pytest.mark.parametrize("case", CASES)
def test_each_family_is_read_whole(case):
    text, content, calls = CASES[case]
    reading = read(text, True, TOOLS)
    assert (reading.content, calls_of(reading)) == (content, calls)
    for _, arguments in calls:
        json.loads(arguments)


@pytest.mark.parametrize("case", CASES)
def test_a_stream_split_anywhere_joins_into_the_whole_answer_and_leaks_no_call(case):
    text, content, calls = CASES[case]
    for cut in range(len(text) + 1):
        stream = ReadingStream("chatcmpl-1", 0, TOOLS)
        parts = [stream.step(text[:cut], False), stream.step(text, False), stream.step(text, True)]
        streamed_content = "".join(p[1] for p in parts)
        assert streamed_content == content, cut
        assert "<tool_call>" not in streamed_content and "[TOOL_CALLS]" not in streamed_content
        assert _joined([d for p in parts for d in p[2]]) == calls, cut


def test_a_stream_fed_character_by_character_sends_name_first_then_fragments():
    text, _, calls = CASES["hermes"]
    stream = ReadingStream("chatcmpl-1", 0, TOOLS)
    deltas = [d for i in range(len(text) + 1) for d in stream.step(text[:i], i == len(text))[2]]
    firsts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]["name"], d["function"]["arguments"]) for d in firsts] == [
        (0, "weather", ""), (1, "time", "")]
    assert firsts[0]["id"] == call_id("chatcmpl-1", 0, 0) != firsts[1]["id"]
    assert len(deltas) > 10  # the arguments came in many fragments
    assert _joined(deltas) == calls


def _joined(deltas: list[dict]) -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        entry = calls.setdefault(d["index"], ["", ""])
        entry[0] += d.get("function", {}).get("name", "")
        entry[1] += d.get("function", {}).get("arguments", "")
    return [tuple(calls[i]) for i in sorted(calls)]


def test_reasoning_goes_apart_from_content_and_calls():
    text = ('<think>It is cold.\nCheck.</think>\n\nOK.'
            '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    reading = read(text, True, TOOLS)
    assert (reading.reasoning, reading.content, calls_of(reading)) == ("It is cold.\nCheck.", "OK.",
                                                                       [("f", '{"a": 1}')])
    stream = ReadingStream("x", 0, TOOLS)
    parts = [stream.step(text[:i], False) for i in range(len(text) + 1)] + [stream.step(text, True)]
    assert "".join(p[0] for p in parts) == "It is cold.\nCheck."
    assert "".join(p[1] for p in parts) == "OK."


def test_without_tools_a_call_stays_text_and_reasoning_still_goes_apart():
    text = '<think>hm</think>Here: <tool_call>{"name": "f"}</tool_call>'
    reading = read(text, True, ReadOptions())
    assert reading.reasoning == "hm" and reading.calls == ()
    assert reading.content == 'Here: <tool_call>{"name": "f"}</tool_call>'


def test_a_forced_answer_is_a_json_array_of_calls():
    text = '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    forced = ReadOptions(tools=True, forced=True)
    assert calls_of(read(text, True, forced)) == [("f", '{"a": 1}'), ("g", "{}")]


def test_a_named_parser_reads_its_family_only():
    text, _, _ = CASES["hermes"]
    reading = read(text, True, ReadOptions(tools=True, parser="mistral"))
    assert reading.calls == () and reading.content == text.rstrip()


def test_the_whole_message_has_tool_calls_and_null_content():
    text, _, calls = CASES["llama3_json"]
    message, called = message_of(text, AnswerOptions(tools=("weather", "time")), "chatcmpl-9", 0)
    assert called and message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == calls
    assert message["tool_calls"][0]["id"] == call_id("chatcmpl-9", 0, 0)


def test_an_unfinished_call_cut_by_length_is_not_a_call():
    reading = read('<tool_call>{"name": "f", "arguments": {"a": ', True, TOOLS)
    assert reading.finished_calls() == ()


def test_tokenize_renders_with_the_tools_and_template_options_a_chat_request_would():
    from fsched.core.jobs.inputs import InputError
    from fsched.core.openai.tokenize import parse_tokenize

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    asked = parse_tokenize({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                            "chat_template_kwargs": {"enable_thinking": False}})
    assert asked.render.to_json() == {"tools": tools, "kwargs": {"enable_thinking": False}}
    with pytest.raises(InputError) as refused:
        parse_tokenize({"messages": [{"role": "user", "content": "hi"}],
                        "chat_template_kwargs": {"add_generation_prompt": False}})
    assert refused.value.field.startswith("chat_template_kwargs")


def test_without_parallel_calls_the_first_call_alone_is_read():
    text, _, _ = CASES["hermes"]
    reading = read(text, True, ReadOptions(tools=True, one_call=True))
    assert calls_of(reading) == [("weather", ARGS)]
    stream = ReadingStream("x", 0, ReadOptions(tools=True, one_call=True))
    deltas = [d for i in range(len(text) + 1) for d in stream.step(text[:i], i == len(text))[2]]
    assert _joined(deltas) == [("weather", ARGS)]


def test_tool_requests_read_as_mistrals_keep_special_tokens_unless_asked_not_to():
    """Mistral's tokenizers make `[TOOL_CALLS]` a special token: decoded with special tokens skipped
    (the default), the marker is gone and the call reads as content."""
    from fsched.core.jobs.limits import InputLimits
    from fsched.core.openai.body import parse_body
    from fsched.core.types import Endpoint

    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}

    def skips(parser: str, **extra) -> bool:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], **extra}
        (spec,) = parse_body(Endpoint.CHAT, body, InputLimits(), 256, tool_parser=parser).specs
        return spec.params.skip_special_tokens

    assert not skips("mistral") and not skips("mistral", tool_choice="auto")
    assert skips("mistral", skip_special_tokens=True)  # the caller's word stands
    assert skips("mistral", tool_choice="none") and skips("hermes") and skips("auto")
