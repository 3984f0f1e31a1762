"""A stream's chunks as JSON text: the template a text chunk is made from writes exactly what encoding
the chunk's dict writes, for every kind of chunk and text."""

from __future__ import annotations

import json

import pytest

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.openai.online import parse_online
from fsched.core.openai.streams import StreamRelay
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
