"""A model folder whose tokenizer carries its own response template (transformers' `response_template`)
is read by it: `fsched serve --tokenizer FOLDER` under the default `--tool-call-parser auto`, in front of
`fsched daemon --engine URL` over the stand-in engine scripted to answer in the template's syntax
(`<reason>...</reason>`, `<call>{json}</call>`: no known family's). The chat answer, whole and
streamed, and a Batch API line with tools carry the same reasoning, content and calls; no call's text
reaches the content.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .http_server import Server, make_server, run_sdk_batch

pytestmark = pytest.mark.timeout(120)

SPEC = Path(__file__).parent.parent / "support" / "templates" / "response_template.json"
ARGUMENTS = '{"city": "Paris"}'
TEXT = ('<reason>I should look it up.</reason>Let me check.\n'
        f'<call>{{"name": "weather", "arguments": {ARGUMENTS}}}</call>')
WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
BODY = {"model": "m", "messages": [{"role": "user", "content": "weather in Paris?"}], "tools": [WEATHER]}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_cache) -> Server:
    from fsched.core.runners.hf.model import ensure_tiny_model
    from tests.support.fake_engine import FakeEngine

    root = tmp_path_factory.mktemp("template")
    folder = root / "model"
    folder.mkdir()
    for path in ensure_tiny_model(Path(model_cache) / "fsched").iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, folder / path.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["response_template"] = json.loads(SPEC.read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config))

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    assert tok.response_template == config["response_template"]  # transformers reads it as the tokenizer's
    answer = tok.encode(TEXT, add_special_tokens=False)
    engine = FakeEngine(step_s=0.002, vocab=2000, eos=2, tokenizer=str(folder), context=2048,
                        script=lambda prompt: answer)
    s = make_server(root, model_cache)
    s.cli("limits", "show")
    s.start_daemon("--engine", engine.url, "--model", str(folder))
    s.start_server("--tokenizer", str(folder))
    s.wait_ready()
    yield s
    s.stop()
    engine.stop()


def test_whole_streamed_and_batch_answers_are_read_by_the_template(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key=server.key("t", "realtime"), max_retries=0)
    choice = client.chat.completions.create(**BODY).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    assert choice.message.model_extra["reasoning_content"] == "I should look it up."
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("weather", ARGUMENTS)]

    content, reasoning, calls, reasons = "", "", {}, []
    for chunk in client.chat.completions.create(**BODY, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for d in delta.tool_calls or ():
            entry = calls.setdefault(d.index, ["", ""])
            entry[0] += d.function.name or ""
            entry[1] += d.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert (content, reasoning, reasons[-1]) == ("Let me check.", "I should look it up.", "tool_calls")
    assert [tuple(c) for c in calls.values()] == [("weather", ARGUMENTS)]

    _, (out,) = run_sdk_batch(client, [BODY], timeout=60)
    message = out["response"]["body"]["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Let me check.", "I should look it up.")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("weather", ARGUMENTS)]
