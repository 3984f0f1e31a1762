"""A Responses stream's output items while an answer with tools is written: pure.

With tools, an answer is items, in order: its reasoning, its message, one
function call a call (`output_items` of responses.py, read from the whole
text). While the text grows, each item is opened (`output_item.added`) once
the reading shows it, and its text comes as it is written:
`reasoning_text.delta`, `output_text.delta`, and a call's arguments in
`function_call_arguments.delta` fragments (the call's name is in its added
item, so it goes first), the same reading as chat's deltas. At the answer's
end the rest of each item's text, then each item's done events carrying the
final item, then any item the end alone shows (a message with no text when
nothing was called).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fsched.core.openai.toolcalls.message import call_id
from fsched.core.openai.toolcalls.reading import ReadOptions, read

Event = Callable[..., dict]  # the relay's numbered event: (kind, **fields) -> event


@dataclass(slots=True)
class ItemsStream:
    response_id: str
    options: ReadOptions
    event: Event
    opened: list[dict] = field(default_factory=list)  # the items opened, in order, as first sent
    sent: list[int] = field(default_factory=list)  # per opened item: characters of its text sent

    @property
    def _suffix(self) -> str:
        return self.response_id.removeprefix("resp_")

    def update(self, text: str, final: bool = False) -> Iterator[dict]:
        """The events the text so far adds."""
        reading = read(text, final, self.options)
        if reading.reasoning is not None:
            yield from self._grow(self._reasoning_item(), reading.reasoning)
        if reading.content:
            yield from self._grow(self._message_item(), reading.content)
        for i, call in enumerate(reading.calls):
            if call.name is None:
                break
            yield from self._grow(self._call_item(i, call.name), call.arguments)

    def close(self, text: str, items: list[dict]) -> Iterator[dict]:
        """At the end: the rest of each item's text, then each item's done events (`items`: the
        answer's final items), the items not yet opened whole. A call opened but cut before its end
        (by max_output_tokens) is not one of the answer's items: it ends `incomplete`, as it was sent."""
        yield from self.update(text, final=True)
        final = {item["id"] for item in items}
        for index, opened in enumerate(self.opened):
            if opened["id"] not in final:
                yield self.event("response.output_item.done", output_index=index,
                                 item={**opened, "status": "incomplete"})
        for item in items:
            ids = [o["id"] for o in self.opened]
            if item["id"] not in ids:
                yield from self._open(item)
                ids.append(item["id"])
            yield from self._done(ids.index(item["id"]), item)

    def _grow(self, item: dict, text: str) -> Iterator[dict]:
        ids = [o["id"] for o in self.opened]
        if item["id"] not in ids:
            yield from self._open(item)
            ids.append(item["id"])
        index = ids.index(item["id"])
        fragment = text[self.sent[index]:]
        if not fragment:
            return
        self.sent[index] = len(text)
        if item["type"] == "function_call":
            self.opened[index]["arguments"] = text  # what was sent, should the call be cut
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            yield self.event("response.function_call_arguments.delta", **where, delta=fragment)
        elif item["type"] == "reasoning":
            yield self.event("response.reasoning_text.delta", **where, content_index=0, delta=fragment)
        else:
            yield self.event("response.output_text.delta", **where, content_index=0, delta=fragment,
                             logprobs=[])

    def _open(self, item: dict) -> Iterator[dict]:
        index = len(self.opened)
        opened = {**item, "status": "in_progress"}
        if item["type"] == "message":
            opened["content"] = []
        elif item["type"] == "function_call":
            opened["arguments"] = ""
        elif item["type"] == "reasoning":
            opened["content"] = []
        self.opened.append(opened)
        self.sent.append(0)
        yield self.event("response.output_item.added", output_index=index, item=dict(opened))
        if item["type"] == "message":
            yield self.event("response.content_part.added", item_id=item["id"], output_index=index,
                             content_index=0, part=_part("", []))

    def _done(self, index: int, item: dict) -> Iterator[dict]:
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            yield self.event("response.function_call_arguments.done", **where, name=item["name"],
                             arguments=item["arguments"])
        elif item["type"] == "reasoning":
            yield self.event("response.reasoning_text.done", **where, content_index=0,
                             text=item["content"][0]["text"])
        else:
            part = item["content"][0]
            yield self.event("response.output_text.done", **where, content_index=0, text=part["text"],
                             logprobs=part["logprobs"])
            yield self.event("response.content_part.done", **where, content_index=0, part=part)
        yield self.event("response.output_item.done", output_index=index, item=item)

    def _reasoning_item(self) -> dict:
        return {"type": "reasoning", "id": f"rs_{self._suffix}", "summary": []}

    def _message_item(self) -> dict:
        return {"type": "message", "id": f"msg_{self._suffix}", "role": "assistant"}

    def _call_item(self, i: int, name: str) -> dict:
        return {"type": "function_call", "id": f"fc_{self._suffix}_{i}",
                "call_id": call_id(self.response_id, 0, i), "name": name}


def _part(text: str, logprobs: list) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
