"""A Responses stream with tools sends each output item as the answer's reading shows it: the item
opened first (a call's name in it), its text in deltas as it is written, its done events carrying
the final item; fed the text at every split, the deltas join into the whole answer's items."""

from __future__ import annotations

import json

import pytest

from fsched.core.openai.answers import AnswerChoice
from fsched.core.openai.responses import output_items
from fsched.core.openai.responses_items import ItemsStream
from fsched.core.openai.toolcalls.message import read_options
from fsched.core.types import AnswerOptions

ANSWER = AnswerOptions(tools=("weather", "time"))
CALLS = ('<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
         '<tool_call>\n{"name": "time", "arguments": {"zone": "CET"}}\n</tool_call>')
TEXTS = {
    "reasoning, content, two calls": f"<think>Look it up.</think>Let me check.\n{CALLS}",
    "a call alone": CALLS,
    "no call": "<think>Easy.</think>It is sunny.",
    "nothing": "",
    "a call cut by max_output_tokens": 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"ci',
}


def stream(text: str, splits: list[int]) -> tuple[list[dict], list[dict]]:
    """The events of `text` fed at `splits` then closed, and the answer's final items."""
    events: list[dict] = []
    items = ItemsStream("resp_1", read_options(ANSWER), lambda kind, **f: {"type": kind, **f})
    for k in splits:
        events += items.update(text[:k])
    final = output_items("resp_1", AnswerChoice(0, text), ANSWER, logprobs=False)
    events += items.close(text, final)
    return events, final


def rebuilt(events: list[dict]) -> list[dict]:
    """The items as a client assembles them from the events (the added item, grown by the deltas),
    checking each event's place."""
    items: list[dict] = []
    for e in events:
        if e["type"] == "response.output_item.added":
            assert e["output_index"] == len(items)
            item = dict(e["item"])
            item["text"] = ""
            items.append(item)
            continue
        item = items[e["output_index"]]
        assert "item_id" not in e or e["item_id"] == item["id"]
        if e["type"].endswith(".delta"):
            assert "done" not in item, e  # nothing after an item's end
            item["arguments" if item["type"] == "function_call" else "text"] += e["delta"]
        elif e["type"] == "response.output_item.done":
            item["done"] = e["item"]
    return items


@pytest.mark.parametrize("case", sorted(TEXTS))
def test_the_deltas_join_into_the_final_items_at_every_split(case):
    text = TEXTS[case]
    for k in range(len(text) + 1):
        events, final = stream(text, [k])
        items = rebuilt(events)
        cut = [i for i in items if i["done"]["status"] == "incomplete"]  # every item opened is ended
        assert [i["done"] for i in items if i not in cut] == final, k
        assert all(i["done"]["type"] == "function_call" and i["done"]["arguments"] == i["arguments"]
                   for i in cut)
        for item, done in zip([i for i in items if i not in cut], final, strict=True):
            if done["type"] == "function_call":
                assert (item["name"], item["arguments"]) == (done["name"], done["arguments"])
            else:
                assert item["text"] == done["content"][0]["text"]


def test_fed_character_by_character_a_call_is_named_first_then_streamed_in_fragments():
    text = TEXTS["reasoning, content, two calls"]
    events, final = stream(text, list(range(len(text) + 1)))
    kinds = [e["type"] for e in events]
    assert [i["type"] for i in final] == ["reasoning", "message", "function_call", "function_call"]
    first = kinds.index("response.function_call_arguments.delta")
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert added[2]["item"]["name"] == "weather" and events.index(added[2]) < first
    fragments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
                 and e["output_index"] == 2]
    assert len(fragments) > 10 and "".join(fragments) == final[2]["arguments"]
    assert json.loads(final[2]["arguments"]) == {"city": "Paris", "days": 3}
    # The text arrived before the end: the first argument fragment comes before any item's done.
    assert first < kinds.index("response.output_item.done")
    content = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert content == "Let me check."  # no call's text in the message
