"""Structured output on the built-in engine: a job of batch lines under a JSON schema, served by the
daemon on a real job table with the tiny model; every output line's text parses and validates.

The tiny model has random weights, so only the grammar makes its output JSON: a schema whose every
field is bounded (strings by maxLength, integers by a range, arrays by maxItems, no extra
properties) ends within a bounded number of tokens, which max_tokens covers. A request cut by
max_tokens before its JSON is complete says so: finish_reason "length".
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

pytest.importorskip("torch")

from fsched.core.daemon.build import DaemonSettings, build_daemon  # noqa: E402
from fsched.core.openai.results import output_line  # noqa: E402
from fsched.core.ports.records import JobSubmission  # noqa: E402
from fsched.core.types import (  # noqa: E402
    ChatMessage,
    Endpoint,
    RequestClass,
    RequestSpec,
    ResponseFormat,
    ResponseFormatType,
    SamplingParams,
)
from fsched.storage.jobstore import SqlJobStore  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 16},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["news", "sport", "tech"]},
                 "maxItems": 3},
        "urgent": {"type": "boolean"},
    },
    "required": ["title", "score", "tags", "urgent"],
    "additionalProperties": False,
}
# The longest output the schema allows, in tokens, is well under this (a string character is at
# most one escape, 6 tokens, on this byte-level tokenizer): see docs/http.md on sizing max_tokens.
MAX_TOKENS = 200
WORDS = "extract the title score tags and urgency of this short news report about a local match".split()


def lines(n: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    fmt = ResponseFormat.json_schema(SCHEMA, name="report")
    specs = []
    for i in range(n):
        text = " ".join(rng.choices(WORDS, k=rng.randint(4, 30)))
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=rng.choice([0.0, 0.7, 1.0]),
                                seed=rng.randrange(1 << 40), response_format=fmt)
        if i % 2:
            specs.append(RequestSpec(f"doc{i}", Endpoint.CHAT, params,
                                     messages=(ChatMessage("user", text),)))
        else:
            specs.append(RequestSpec(f"doc{i}", Endpoint.COMPLETIONS, params, prompt=text))
    return specs


def serve(tmp_path, specs: list[RequestSpec], max_batch: int = 32, engine: str = "hf") -> list[dict]:
    """Submit one job of `specs`, serve it with the tiny model (or a remote engine and the tiny
    model's tokenizer) until idle, return its output lines."""
    store = SqlJobStore(f"sqlite:///{tmp_path / 'fsched.db'}")
    try:
        (job,) = store.submit([JobSubmission(tuple(specs), "alice",
                                             RequestClass.BATCH, 5, "extract")])
        settings = DaemonSettings(model=None, device="cpu", until_idle=True, threads=1, max_batch=max_batch,
                                  engine=engine)
        build_daemon(settings, store, exclusive=True).run()
        return [output_line(r) for r in store.iter_results(job.job_id)]
    finally:
        store.db.dispose()


def text_of(line: dict) -> tuple[str, str]:
    body = line["response"]["body"]
    choice = body["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return text, choice["finish_reason"]


@pytest.fixture
def remote_engine():
    """The stand-in engine with the tiny model's tokenizer: it honours response_format (with
    llguidance) as vLLM does, so fsched's path to a remote engine is what is tested here."""
    from fsched.core.runners.hf.model import ensure_tiny_model
    from tests.support.fake_engine import FakeEngine

    engine = FakeEngine(step_s=0.002, vocab=2000, eos=2, tokenizer=str(ensure_tiny_model()), context=2048)
    yield engine
    engine.stop()


@pytest.mark.parametrize("where", ["builtin", "remote"])
def test_every_output_of_a_schema_job_parses_and_validates(tmp_path, request, where):
    n = 200 if request.config.getoption("--long") else 32
    engine = request.getfixturevalue("remote_engine").url if where == "remote" else "hf"
    out = serve(tmp_path, lines(n, seed=1), max_batch=32 if where == "builtin" else 8, engine=engine)
    assert len(out) == n and all(line["error"] is None for line in out)
    values = []
    for line in out:
        text, reason = text_of(line)
        assert reason == "stop", (line["custom_id"], text)
        value = json.loads(text)
        jsonschema.validate(value, SCHEMA)
        values.append(value)
    assert len({json.dumps(v, sort_keys=True) for v in values}) > n // 2  # the model chose, not a template


def test_a_json_object_request_yields_an_object_and_a_cut_one_says_length(tmp_path):
    obj = ResponseFormat(ResponseFormatType.JSON_OBJECT)
    specs = [
        # Any JSON object: a random model may write one without end, so only the cut is certain.
        RequestSpec("short", Endpoint.COMPLETIONS, SamplingParams(max_tokens=3, temperature=0, seed=1,
                                                                  response_format=obj), prompt="report"),
        RequestSpec("cut", Endpoint.COMPLETIONS, SamplingParams(max_tokens=6, temperature=1.0, seed=2,
                    response_format=ResponseFormat.json_schema(SCHEMA)), prompt="report"),
    ]
    by_id = {line["custom_id"]: text_of(line) for line in serve(tmp_path, specs)}
    for custom_id in ("short", "cut"):
        text, reason = by_id[custom_id]
        assert reason == "length" and text.startswith("{")
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)  # not complete, and it does not pretend to be
