"""A template that opens `<think>` for the model (Qwen3's thinking models, DeepSeek-R1) makes the answer
start inside its reasoning, with only `</think>` in the text: the reasoning is read apart from the
answer all the same (chat's `reasoning_content`, whole and streamed, and the Responses reasoning item),
and a template that wrote a closed, empty block (`enable_thinking: false`) gives no reasoning. Whether
the prompt opened it is read from the rendered prompt's end and stored with the request's answer
options, so every reader of the answer (a resumed stream, a batch's results) reads it alike."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.answers import AnswerChoice
from fsched.core.openai.body import parse_body
from fsched.core.openai.responses import output_items
from fsched.core.openai.responses_items import ItemsStream
from fsched.core.openai.toolcalls.message import ReadingStream, message_of, read_options
from fsched.core.openai.toolcalls.reading import ReadOptions, prompt_opens_reasoning, read
from fsched.core.types import AnswerOptions, Endpoint

TEMPLATE = (Path(__file__).parent.parent / "support" / "templates" / "qwen3_thinking.jinja").read_text()
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "The user wants Paris.\nI should look it up."
TEXT = f"{THOUGHT}\n</think>\n\nLet me check.\n{CALL}"
QUESTION = [{"role": "user", "content": "weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def rendered(messages: list[dict], render: dict | None) -> str:
    """The test template rendered as transformers renders chat templates (jinja2, tojson)."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = json.dumps
    render = render or {}
    return env.from_string(TEMPLATE).render(messages=messages, tools=render.get("tools"),
                                            add_generation_prompt=True, **render.get("kwargs", {}))


def thinking(messages: list[dict], render: dict | None) -> bool:
    return prompt_opens_reasoning(rendered(messages, render))


def test_the_prompt_end_says_whether_the_reasoning_is_open():
    assert rendered(QUESTION, None).endswith("<|im_start|>assistant\n<think>\n")
    assert thinking(QUESTION, None) and thinking(QUESTION, {"kwargs": {"enable_thinking": True}})
    off = rendered(QUESTION, {"kwargs": {"enable_thinking": False}})
    assert off.endswith("<think>\n\n</think>\n\n") and not prompt_opens_reasoning(off)
    assert not prompt_opens_reasoning("<|bos|>user: hi\n<|bos|>assistant:")
    assert prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>\n")  # DeepSeek-R1's


def test_an_opened_reasoning_is_read_apart_whole():
    reading = read(TEXT, True, ReadOptions(tools=True, thinking=True))
    assert reading.reasoning == THOUGHT + "\n" and reading.content == "Let me check."
    assert [(c.name, c.arguments) for c in reading.finished_calls()] == [("weather", '{"city": "Paris"}')]
    # the same text, the prompt not having opened a block: no reasoning, the tag stays text
    assert read(TEXT, True, ReadOptions()).reasoning is None


def test_a_cut_answer_is_all_reasoning_and_a_model_repeating_the_tag_is_read_alike():
    cut = read("Still thinking", True, ReadOptions(thinking=True))
    assert (cut.reasoning, cut.content) == ("Still thinking", "")
    again = read(f"<think>{THOUGHT}</think>Hi.", True, ReadOptions(thinking=True))
    assert (again.reasoning, again.content) == (THOUGHT, "Hi.")


@pytest.mark.parametrize("text", [TEXT, f"<think>{THOUGHT}</think>Hi.", "Hm</thi", "Done.</think>Hi."])
def test_an_opened_reasoning_streamed_split_anywhere_joins_into_the_whole(text):
    answer = AnswerOptions(tools=("weather",), thinking=True)
    whole, _ = message_of(text, answer, "chatcmpl-1", 0)
    for cut in range(len(text) + 1):
        stream = ReadingStream("chatcmpl-1", 0, read_options(answer))
        parts = [stream.step(text[:cut], False), stream.step(text, False), stream.step(text, True)]
        assert "".join(p[0] for p in parts) == whole.get("reasoning_content", ""), cut
        assert "".join(p[1] for p in parts) == (whole["content"] or ""), cut
        assert "</think>" not in "".join(p[0] + p[1] for p in parts)


def test_chat_and_responses_answers_carry_the_reasoning_without_tools():
    answer = AnswerOptions(thinking=True)
    message, called = message_of("Easy.</think>\n\nIt is sunny.", answer, "chatcmpl-2", 0)
    assert (message["reasoning_content"], message["content"], called) == ("Easy.", "It is sunny.", False)
    items = output_items("resp_2", AnswerChoice(0, "Easy.</think>\n\nIt is sunny."), answer, logprobs=False)
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[0]["content"][0]["text"] == "Easy."
    assert items[1]["content"][0]["text"] == "It is sunny."
    events = list(ItemsStream("resp_2", read_options(answer), lambda kind, **f: {"type": kind, **f})
                  .update("Easy.</think>\n\nIt is"))
    deltas = {e["type"]: e["delta"] for e in events if "delta" in e}
    assert deltas == {"response.reasoning_text.delta": "Easy.", "response.output_text.delta": "It is"}


def body(**extra) -> dict:
    return {"model": "m", "messages": QUESTION, "tools": [WEATHER], **extra}


def test_a_chat_request_stores_whether_its_prompt_opened_the_reasoning():
    specs = parse_body(Endpoint.CHAT, body(), InputLimits(), 256, thinking=thinking).specs
    assert specs[0].answer.thinking
    stored = AnswerOptions.from_json(specs[0].answer.to_json())  # what a resumed reader builds
    assert stored.thinking and read_options(stored).thinking
    off = parse_body(Endpoint.CHAT, body(chat_template_kwargs={"enable_thinking": False}), InputLimits(), 256,
                     thinking=thinking).specs
    assert not off[0].answer.thinking and off[0].answer.to_json().get("thinking") is None
    assert not parse_body(Endpoint.CHAT, body(), InputLimits(), 256).specs[0].answer.thinking


def test_a_grammar_held_answer_is_read_as_content_or_calls_not_as_an_open_reasoning():
    """The grammar holds the answer from its first token: a template's opened block never gets its
    `</think>`, and reading the answer as reasoning would lose the JSON or the call."""
    named = {"type": "function", "function": {"name": "weather"}}
    for extra in ({"tool_choice": "required"}, {"tool_choice": named}):
        (spec,) = parse_body(Endpoint.CHAT, body(**extra), InputLimits(), 256, thinking=thinking).specs
        assert not spec.answer.thinking
        message, called = message_of('[{"name": "weather", "arguments": {"city": "Paris"}}]', spec.answer,
                                     "chatcmpl-1", 0)
        assert called and message["tool_calls"][0]["function"]["name"] == "weather", message
        assert "reasoning_content" not in message
    json_body = {"model": "m", "messages": QUESTION, "response_format": {"type": "json_object"}}
    (spec,) = parse_body(Endpoint.CHAT, json_body, InputLimits(), 256, thinking=thinking).specs
    message, called = message_of('{"city": "Paris"}', spec.answer, "chatcmpl-1", 0)
    assert not called and message["content"] == '{"city": "Paris"}' and "reasoning_content" not in message
    (auto,) = parse_body(Endpoint.CHAT, body(tool_choice="auto"), InputLimits(), 256, thinking=thinking).specs
    assert auto.answer.thinking  # no grammar: the model writes its reasoning first


def test_a_template_refusing_the_messages_is_a_400_naming_them():
    def refusing(_messages, _render):
        raise ValueError("Conversation roles must alternate")

    from fsched.core.jobs.inputs import InputError

    with pytest.raises(InputError) as caught:
        parse_body(Endpoint.CHAT, body(), InputLimits(), 256, thinking=refusing)
    assert caught.value.field == "messages" and "alternate" in caught.value.message


def test_a_batch_line_stores_it_too():
    from fsched.core.openai.batchfile import parse_job_pieces

    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body()}
    off = {**line, "custom_id": "b", "body": body(chat_template_kwargs={"enable_thinking": False})}
    data = (json.dumps(line) + "\n" + json.dumps(off) + "\n").encode()
    specs = parse_job_pieces((data,), "lines.jsonl", thinking=thinking)
    assert [s.answer.thinking for s in specs] == [True, False]
