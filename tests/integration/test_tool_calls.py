"""Required and named tool calls on the built-in engine and in front of a remote one: batch lines with
tools, served by the daemon with the tiny model; every answer is a tool call whose arguments validate.

The tiny model has random weights and never decides to call a tool: only the grammar a required or
named call is held to makes its output a call. The tools' schemas are bounded (strings by
maxLength, numbers by range, enums) so an answer ends within max_tokens.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

pytest.importorskip("torch")

from fsched.core.jobs.limits import InputLimits  # noqa: E402
from fsched.core.openai.batchfile import parse_job_file  # noqa: E402
from tests.integration.test_structured_output import serve  # noqa: E402

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "the forecast",
                                           "strict": True, "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "strict": True, "parameters": TIME}}]
SCHEMAS = {"weather": {**WEATHER, "additionalProperties": False},
           "time": {**TIME, "additionalProperties": False}}
WORDS = "what is the weather and the time in paris or oslo tomorrow and next week please".split()


def batch_lines(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        named = {"type": "function", "function": {"name": rng.choice(["weather", "time"])}}
        choice = "required" if i % 3 else named
        body = {"model": "tiny", "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=8))}],
                "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False, "max_tokens": 200,
                "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randrange(1 << 40)}
        out.append(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": body}))
    return ("\n".join(out) + "\n").encode()


@pytest.fixture
def remote_engine():
    from fsched.core.runners.hf.model import ensure_tiny_model
    from tests.support.fake_engine import FakeEngine

    engine = FakeEngine(step_s=0.002, vocab=2000, eos=2, tokenizer=str(ensure_tiny_model()), context=2048)
    yield engine
    engine.stop()


@pytest.mark.parametrize("where", ["builtin", "remote"])
def test_every_required_or_named_call_parses_and_validates(tmp_path, request, where):
    n = 200 if request.config.getoption("--long") else 24
    specs = parse_job_file(batch_lines(n, seed=3), "calls.jsonl", InputLimits())
    engine = request.getfixturevalue("remote_engine").url if where == "remote" else "hf"
    out = serve(tmp_path, specs, max_batch=32 if where == "builtin" else 8, engine=engine)
    assert len(out) == n and all(line["error"] is None for line in out)
    named = {json.loads(line)["custom_id"]: json.loads(line)["body"]["tool_choice"]
             for line in batch_lines(n, seed=3).decode().splitlines()}
    for line in out:
        choice = line["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "tool_calls", line
        message = choice["message"]
        assert message["content"] is None and len(message["tool_calls"]) == 1
        call = message["tool_calls"][0]
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        if isinstance(named[line["custom_id"]], dict):
            assert name == named[line["custom_id"]]["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
