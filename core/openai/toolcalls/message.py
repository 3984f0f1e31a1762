"""A chat answer's reading in OpenAI's shapes: the whole message, and the deltas of a stream.

`message_of` is the assistant message of a whole answer; `ReadingStream` turns
the readings of a growing text into what each chunk adds: reasoning and
content fragments, and per call (by index) its id, type and name first, then
fragments of its arguments, as OpenAI and vLLM stream them. A call's id is
derived from the answer's id and the call's position, so one answer always
names its calls alike.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from fsched.core.openai.toolcalls.reading import Reading, ReadOptions, plain_from_here, read
from fsched.core.types import AnswerOptions


def read_options(answer: AnswerOptions) -> ReadOptions:
    return ReadOptions(tools=bool(answer.tools), forced=answer.forced_tools, parser=answer.tool_parser,
                       one_call=answer.one_call, thinking=answer.thinking)


def call_id(answer_id: str, choice: int, index: int) -> str:
    digest = hashlib.blake2b(f"{answer_id}:{choice}:{index}".encode(), digest_size=12).hexdigest()
    return f"call_{digest}"


def message_of(text: str, answer: AnswerOptions, answer_id: str, choice: int) -> tuple[dict, bool]:
    """The assistant message of a whole answer, and whether it calls tools."""
    reading = read(text, True, read_options(answer))
    calls = reading.finished_calls()
    message: dict = {"role": "assistant", "content": reading.content or (None if calls else "")}
    if reading.reasoning is not None:
        message["reasoning_content"] = reading.reasoning
    if calls:
        message["tool_calls"] = [
            {"id": call_id(answer_id, choice, i), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
    return message, bool(calls)


def finish_reason(reason: str | None, calls: bool) -> str:
    reason = reason or "stop"
    return "tool_calls" if calls and reason == "stop" else reason


@dataclass(slots=True)
class ReadingStream:
    """What of one choice's reading a client has, and what a new reading adds."""

    answer_id: str
    choice: int
    options: ReadOptions
    reasoning: int = 0
    content: int = 0
    calls: list[tuple[bool, int]] = field(default_factory=list)  # per call: name sent, argument chars sent
    plain: bool = False  # every later text reads as content alone (`plain_from_here`): none is read

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def step(self, text: str, final: bool) -> tuple[str, str, list[dict]]:
        """The reasoning, content and call fragments the text so far adds."""
        if self.plain:  # what `read` would find, without reading the whole text again at every token
            content = text[self.content:]
            self.content += len(content)
            return "", content, []
        reading = read(text, final, self.options)
        self.plain = plain_from_here(text, self.options)
        reasoning = (reading.reasoning or "")[self.reasoning:]
        content = reading.content[self.content:]
        self.reasoning += len(reasoning)
        self.content += len(content)
        return reasoning, content, self._call_deltas(reading)

    def _call_deltas(self, reading: Reading) -> list[dict]:
        out = []
        for i, call in enumerate(reading.calls):
            if call.name is None:
                break
            if i == len(self.calls):
                self.calls.append((False, 0))
            named, sent = self.calls[i]
            delta: dict = {"index": i}
            if not named:
                delta.update(id=call_id(self.answer_id, self.choice, i), type="function")
                delta["function"] = {"name": call.name, "arguments": ""}
            fragment = call.arguments[sent:]
            if fragment:
                delta.setdefault("function", {})["arguments"] = fragment
            if not named or fragment:
                out.append(delta)
            self.calls[i] = (True, len(call.arguments))
        return out
