"""Each known family's chat template, on a tiny tokenizer saved and loaded back as a model folder is:
the tools, an earlier call and its result and the template options reach the template, and a call
written in the family's syntax reads back as the same call.

The templates (tests/support/templates/) are written here in each family's documented format: Hermes
and Qwen 2.5 (`<tool_call>` blocks, `<tool_response>` results), Llama 3.1's JSON form (`ipython`
results) and Mistral's (`[AVAILABLE_TOOLS]`, `[TOOL_CALLS]`, `[TOOL_RESULTS]`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from fsched.core.jobs.limits import InputLimits  # noqa: E402
from fsched.core.openai.messages import messages as checked_messages  # noqa: E402
from fsched.core.openai.toolcalls.reading import ReadOptions, read  # noqa: E402
from fsched.core.runners.hf.model import encode_prompt, ensure_tiny_model  # noqa: E402
from fsched.core.runners.hf.tokenizer import load_tokenizer  # noqa: E402
from fsched.core.types import ChatRender  # noqa: E402

TEMPLATES = Path(__file__).parent.parent / "support" / "templates"
WEATHER = {"type": "function", "function": {"name": "weather", "description": "the forecast",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]
# family -> (what the rendered prompt holds, a call as the model writes it in the family's syntax)
EXPECTED = {
    "hermes": (['"name": "weather"', '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n'
                '</tool_call>', "<tool_response>\n21 C\n</tool_response>", "<think>\n\n</think>\n\n"],
               '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'),
    "llama3_json": (['"description": "the forecast"', '{"name": "weather", "parameters": {"city": "Paris"}}',
                     "ipython<|end_header_id|>\n\n21 C"],
                    '{"name": "weather", "parameters": {"city": "Oslo"}}'),
    "mistral": (['[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Paris"}, "id": "call_1"}]',
                 '[TOOL_RESULTS]{"content": "21 C", "call_id": "call_1"}[/TOOL_RESULTS]'],
                '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]'),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    from transformers import AutoTokenizer

    out = {}
    for family in EXPECTED:
        tokenizer = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
        tokenizer.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
        folder = tmp_path_factory.mktemp(family)
        tokenizer.save_pretrained(folder)
        out[family] = str(folder)
    return out


@pytest.mark.parametrize("family", EXPECTED)
def test_the_template_is_given_tools_history_and_options(folders, family):
    tok = load_tokenizer(folders[family])
    stored = [m.to_json() for m in checked_messages(HISTORY, InputLimits())]
    render = ChatRender((WEATHER,), (("enable_thinking", False),)).to_json()
    ids = encode_prompt(tok, None, stored, render)
    text = tok.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    expected, _ = EXPECTED[family]
    for piece in expected:
        assert piece in text, (piece, text)
    bare = tok.tokenizer.decode(encode_prompt(tok, None, stored[:1]), skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
    assert "weather" not in bare.replace("Weather", "")  # no tools asked: none rendered


@pytest.mark.parametrize("family", EXPECTED)
def test_a_call_in_the_familys_syntax_reads_back(family):
    _, written = EXPECTED[family]
    for parser in (family, "auto"):
        reading = read(written, True, ReadOptions(tools=True, parser=parser))
        (call,) = reading.finished_calls()
        assert (call.name, json.loads(call.arguments), reading.content) == ("weather", {"city": "Oslo"}, "")


def test_mistrals_marker_as_a_special_token_survives_a_tool_requests_decoding(tmp_path):
    """Mistral's tokenizers make `[TOOL_CALLS]` a special token: served with such a folder, a tool
    request is decoded with special tokens kept, so its call is read (with them skipped, the marker
    is gone and the call would be content)."""
    from transformers import AutoTokenizer

    from fsched.core.openai.body import parse_body
    from fsched.core.openai.toolcalls.families import family_of_template
    from fsched.core.openai.toolcalls.message import read_options
    from fsched.core.runners.templates import folder_chat_templates
    from fsched.core.types import Endpoint

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    tokenizer.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    tokenizer.chat_template = (TEMPLATES / "mistral.jinja").read_text()
    tokenizer.save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path)).tokenizer
    _, written = EXPECTED["mistral"]
    ids = tok.encode(written, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("[TOOL_CALLS]") in ids
    assert "[TOOL_CALLS]" not in tok.decode(ids, skip_special_tokens=True)  # the default decoding

    parser = family_of_template(folder_chat_templates(tmp_path))
    body = {"model": "m", "messages": HISTORY[:1], "tools": [WEATHER]}
    (spec,) = parse_body(Endpoint.CHAT, body, InputLimits(), 256, tool_parser=parser).specs
    text = tok.decode(ids, skip_special_tokens=spec.params.skip_special_tokens)
    (call,) = read(text, True, read_options(spec.answer)).finished_calls()
    assert (parser, call.name, json.loads(call.arguments)) == ("mistral", "weather", {"city": "Oslo"})
