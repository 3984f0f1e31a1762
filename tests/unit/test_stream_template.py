"""A stream's chunks as JSON text: the template a text chunk is made from writes exactly what encoding
the chunk's dict writes, for every kind of chunk and text."""

from __future__ import annotations

import json

import pytest

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.openai.online import parse_online
from fsched.core.openai.streams import StreamRelay
from fsched.core.openai.toolcalls.message import ReadingStream
from fsched.core.openai.toolcalls.reading import ReadOptions, read
from fsched.core.ports.records import RequestProgress
from fsched.core.types import Endpoint, RequestClass, RequestStatus

TEXTS = ["he", 'llo "quoted" \\ back', "\n\t\x00\x1f", "é 字 🙂", "\udc80 lone", "</script>", ""]


def _key() -> ApiKey:
    return ApiKey("k1", "alice", RequestClass.REALTIME, "a key", "hash", 0.0)


def _progress(text: str, status: RequestStatus, choice: int = 0) -> RequestProgress:
    return RequestProgress(str(choice), 1, status, text, len(text), 0.0, None, None, None, prompt_tokens=3,
                           choice=choice, tokens=tuple(range(len(text))))


@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS])
@pytest.mark.parametrize("extra", [
    {}, {"stream_options": {"include_usage": True}}, {"n": 2}, {"echo": True},
    {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},  # no template: dicts
])
def test_update_json_writes_what_encoding_the_chunks_writes(endpoint, extra):
    body = {"model": 'm "x"', "stream": True, **extra}
    if endpoint is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
        body.pop("echo", None)
    else:
        body["prompt"] = "A"
    online = parse_online(json.dumps(body), endpoint, _key())
    relays = [StreamRelay(endpoint, 'id-"1"', 1700000000, 'm "x"', online) for _ in range(2)]
    so_far = ""
    choices = len(online.specs)
    for i, piece in enumerate(TEXTS):
        so_far += piece
        status = RequestStatus.FINISHED_STOPPED if i == len(TEXTS) - 1 else RequestStatus.RUNNING
        update = [_progress(so_far, status, c) for c in range(choices)]
        expected = [json_text(c, separators=(",", ":")) for c in relays[0].update(update)]
        assert list(relays[1].update_json(update)) == expected
        for line in expected:
            json.loads(line)


@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS])
@pytest.mark.parametrize("extra", [
    {}, {"stream_options": {"include_usage": True}}, {"n": 3}, {"logprobs": True},
    {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
])
@pytest.mark.parametrize("end", [RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH])
def test_a_streams_opening_and_finishing_chunks_are_what_encoding_them_writes(endpoint, extra, end):
    body = {"model": 'm "x"', "stream": True, **extra}
    if endpoint is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "A"
        if "logprobs" in extra:
            body["logprobs"] = 1
    online = parse_online(json.dumps(body), endpoint, _key())
    relays = [StreamRelay(endpoint, 'id-"1"', 1700000000, 'm "x"', online) for _ in range(2)]
    expected = [json_text(c, separators=(",", ":")) for c in relays[0].opening()]
    assert list(relays[1].opening_json()) == expected and len(expected) == (
        len(online.specs) if endpoint is Endpoint.CHAT else 0)
    ended = [_progress("done", end, c) for c in range(len(online.specs))]
    expected = [json_text(c, separators=(",", ":")) for c in relays[0].update(ended)]
    assert list(relays[1].update_json(ended)) == expected
    assert [json.loads(c)["choices"][0]["finish_reason"] for c in expected][-1] == end.finish_reason


@pytest.mark.parametrize("pieces", [
    ["<think>", "why", " so</think>", "Hel", "lo"],
    ["Sure", "<tool_call>", '{"name": "get', '_weather", "arguments": {"city": "P', 'aris"}}',
     "</tool_call>"],
])
def test_a_running_chats_reasoning_and_calls_are_the_chunks_encoding_writes(pieces):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    online = parse_online(json.dumps(body), Endpoint.CHAT, _key())
    relays = [StreamRelay(Endpoint.CHAT, "id", 1700000000, "m", online) for _ in range(2)]
    for relay in relays:
        list(relay.opening())
    so_far = ""
    for i, piece in enumerate(pieces + [""]):
        so_far += piece
        status = RequestStatus.FINISHED_STOPPED if i == len(pieces) else RequestStatus.RUNNING
        update = [_progress(so_far, status)]
        expected = [json_text(c, separators=(",", ":")) for c in relays[0].update(update)]
        assert list(relays[1].update_json(update)) == expected
    assert relays[1].readings[0].reasoning or relays[1].readings[0].called


# A stream's text as a daemon pushes it: a start that is only whitespace, any character, quotes and escapes,
# an unfinished character (U+FFFD) that a later push completes.
PUSHED = ["", "  ", "he", 'llo "quoted" \\ back', "\n\t\x00\x1f\x7f", "é 字 🙂", "\ufffd", "\udc80 lone",
          "</script>", " <think", "> not reasoning", "\u2028\u2029"]


def _running(body: dict, endpoint: Endpoint, pieces: list[str]) -> tuple[list[str], list[str]]:
    """The chunks of a stream's running pushes, written from progress (`update_json`) by one relay and from
    the text alone (`running_json`) by another, then their ends (from progress, both)."""
    online = parse_online(json.dumps(body), endpoint, _key())
    relays = [StreamRelay(endpoint, 'id-"1"', 1700000000, 'm "x"', online) for _ in range(2)]
    for relay in relays:
        list(relay.opening())
    chunks: list[list[str]] = [[], []]
    so_far = ""
    for i, piece in enumerate(pieces):
        so_far = so_far.removesuffix("\ufffd") + piece if piece != "\ufffd" else so_far + piece
        progress = [RequestProgress("0", 1, RequestStatus.RUNNING, so_far, i + 1, 0.0, None, None, None)]
        chunks[0] += relays[0].update_json(progress)
        if relays[1].streams_running_text():
            chunks[1] += filter(None, [relays[1].running_json(so_far)])
        else:
            chunks[1] += relays[1].update_json(progress)
    final = [RequestProgress("0", 1, RequestStatus.FINISHED_STOPPED, so_far, len(pieces), 0.0, None, None,
                             None)]
    for relay, out in zip(relays, chunks, strict=True):
        out += relay.update_json(final)
    return chunks[0], chunks[1]


@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS])
@pytest.mark.parametrize("usage", [False, True])
def test_a_pushed_running_text_writes_the_chunks_its_progress_writes(endpoint, usage):
    body = {"model": 'm "x"', "stream": True, "stream_options": {"include_usage": usage}}
    if endpoint is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "A"
    from_progress, from_text = _running(body, endpoint, PUSHED)
    assert from_text == from_progress
    assert len(from_progress) > len(PUSHED) // 2  # the pushes did write chunks
    streamed = "".join(json.loads(c)["choices"][0].get("text", "") if endpoint is Endpoint.COMPLETIONS
                       else json.loads(c)["choices"][0]["delta"].get("content") or "" for c in from_progress)
    assert streamed == "".join(p for p in PUSHED if p != "\ufffd")


@pytest.mark.parametrize("pieces", [
    ["<think>", "why", " so</think>", "Hel", "lo"],  # reasoning: its chunks are not text chunks
    ["\n ", "<th", "ink>", "deep</think>", "answer"],  # a start that may yet be `<think>`
    ["Sure", "<tool_call>", '{"name": "get', '_weather", "arguments": {"city": "P', 'aris"}}',
     "</tool_call>"],
])
def test_a_pushed_chats_reasoning_and_calls_are_the_chunks_its_progress_writes(pieces):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    for asked in (body, {k: v for k, v in body.items() if k != "tools"}):
        from_progress, from_text = _running(asked, Endpoint.CHAT, pieces)
        assert from_text == from_progress


@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize("pieces", [
    ["Hel", "lo <think>", "x</think>"], ["<think>", "why</think>", "so"], ["<", "thi", "nk>a</think>b"],
    ["\n", "Hi", " <think>x</think>"],
    ["<", "b>bold"], ["Sure", "<tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>"],
])
def test_a_reading_stream_says_what_reading_each_whole_text_says(tools, pieces):
    options = ReadOptions(tools=tools)
    stream = ReadingStream("id", 0, options)
    text, content, reasoning = "", "", ""
    for piece in pieces:
        text += piece
        said_reasoning, said_content, _ = stream.step(text, False)
        content += said_content
        reasoning += said_reasoning
        whole = read(text, False, options)
        assert (reasoning, content) == (whole.reasoning or "", whole.content)
