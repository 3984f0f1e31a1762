"""What a stream sends as a request's choices grow: pure, one relay a streamed request.

The handler feeds each new read of the choices (`update`) and gets the chunks
to send: per choice, the text that became visible since the last chunk with
its tokens' logprobs and ids, and its finish chunk once it ends. Choices
interleave as their tokens come; each chunk names its choice by index.
`update_json` gives the same chunks as their JSON text: a chunk of new text
alone (most of a stream) from a template made once, its text the one value
escaped, with no dict made and no whole chunk encoded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.jobs.jsontext import string as json_string
from fsched.core.openai.answers import Delta, chunk, usage, usage_chunk
from fsched.core.openai.online import OnlineRequest, choice_of
from fsched.core.openai.toolcalls.message import ReadingStream, finish_reason, read_options
from fsched.core.ports.records import RequestProgress
from fsched.core.types import Endpoint, RequestStatus


@dataclass(slots=True)
class _Sent:
    """How much of one choice the client has: characters, tokens, and whether it has ended."""

    chars: int = 0
    tokens: int = 0
    offset: int = 0  # completions: the text offset of the next token
    started: bool = False
    ended: bool = False


class StreamRelay:
    def __init__(self, endpoint: Endpoint, answer_id: str, created: int, model: str, online: OnlineRequest,
                 prompt_ids: list[list[int]] | None = None):
        self.endpoint = endpoint
        self.answer_id = answer_id
        self.created = created
        self.model = model
        self.online = online
        self.answer = online.spec.answer
        self.sent = [_Sent() for _ in online.specs]
        options = read_options(self.answer)
        self.readings = [ReadingStream(answer_id, i, options) for i in range(len(online.specs))]
        self.latest: Sequence[RequestProgress] = ()
        self.prompt_ids = prompt_ids  # vLLM's prompt_token_ids: sent with the first chunk
        self._template = self._text_template()
        # A finishing chunk's JSON around its finish reason (after the index; after the reason).
        self._finish = None if self._template is None else self._finish_template()

    def _text_template(self) -> tuple[str, str, str] | None:
        """A text chunk's JSON as (before the index, between the index and the text, after the text),
        when such a chunk carries nothing but its text (no logprobs, ids, usage so far or padding)."""
        options = self.online.stream_options
        if self.answer.logprobs or self.answer.token_ids or options.continuous_usage or options.obfuscation:
            return None
        kind, text_key = (("chat.completion.chunk", '"delta":{"content":') if self.endpoint is Endpoint.CHAT
                          else ("text_completion", '"text":'))
        head = (f'{{"id":{json_text(self.answer_id)},"object":"{kind}","created":{int(self.created)},'
                f'"model":{json_text(self.model)},"choices":[{{"index":')
        close = "}" if self.endpoint is Endpoint.CHAT else ""
        return head, "," + text_key, f'{close},"logprobs":null,"finish_reason":null}}]{self._usage_null()}}}'

    def _usage_null(self) -> str:
        return ',"usage":null' if self.online.stream_options.include_usage else ""

    def _finish_template(self) -> tuple[str, str]:
        empty = ',"delta":{}' if self.endpoint is Endpoint.CHAT else ',"text":""'
        return f'{empty},"logprobs":null,"finish_reason":', f"}}]{self._usage_null()}}}"

    def opening(self) -> Iterator[dict]:
        """Chat: each choice's first chunk, with the assistant's role (as OpenAI sends it at once)."""
        if self.endpoint is Endpoint.CHAT:
            for index, sent in enumerate(self.sent):
                sent.started = True
                yield self._chunk(Delta(index, first=True))

    def opening_json(self) -> Iterator[str]:
        """`opening`'s chunks as JSON text (from the template, where the stream has one)."""
        if self._template is None or self.prompt_ids is not None or self.endpoint is not Endpoint.CHAT:
            yield from (json_text(c, separators=(",", ":")) for c in self.opening())
            return
        head, _, tail = self._template
        for index, sent in enumerate(self.sent):
            sent.started = True
            yield f'{head}{index},"delta":{{"role":"assistant","content":""{tail}'

    def update(self, choices: Sequence[RequestProgress]) -> Iterator[dict]:
        """The chunks a new read of the choices calls for (none when nothing visible changed)."""
        return map(self._chunk, self._deltas(choices))

    def update_json(self, choices: Sequence[RequestProgress]) -> Iterator[str]:
        """`update`'s chunks as JSON text (compact, as `jsontext.dumps` writes it)."""
        template = self._template if self.prompt_ids is None else None
        if template is None:
            for delta in self._deltas(choices):
                yield json_text(self._chunk(delta), separators=(",", ":"))
            return
        self.latest = choices
        for p in choices:
            sent = self.sent[p.choice]
            if sent.ended:
                continue
            if not sent.started or p.status.is_finished:  # a first or last chunk: the general path
                for delta in self._choice_deltas(p, sent):
                    yield self._json(delta, template)
                continue
            # A running choice (most of a stream): its new text, from the template, no Delta made.
            text = p.visible_text
            if self.endpoint is Endpoint.CHAT:
                reasoning, new_text, calls = self.readings[p.choice].step(text, False)
                if reasoning or calls:
                    yield self._json(self._made(p, sent, text, reasoning, new_text, calls), template)
                    continue
            else:
                new_text = text[sent.chars:]
            if new_text:
                sent.chars, sent.tokens = len(text), len(p.tokens)
                yield _templated(template, p.choice, new_text)

    def streams_running_text(self) -> bool:
        """Whether `running_json` can take the one choice's next running text: a text chunk has a
        template, and the choice has started and not ended."""
        if self._template is None or self.prompt_ids is not None or len(self.sent) != 1:
            return False
        sent = self.sent[0]
        return sent.started and not sent.ended

    def running_json(self, output_text: str) -> str:
        """The chunk of the one running choice's new text, its whole output so far being `output_text`
        ("" when nothing visible is new), as `update_json` writes it for a running progress of that
        text with no token ids; only while `streams_running_text`. A daemon's push of a plain stream's
        text (most of the tokens) comes here with no progress made."""
        sent = self.sent[0]
        text = output_text.rstrip("\ufffd")  # a running text's visible part (RequestProgress.visible_text)
        if self.endpoint is Endpoint.CHAT:
            reasoning, new_text, calls = self.readings[0].step(text, False)
            if reasoning or calls:
                running = RequestProgress("", 0, RequestStatus.RUNNING, output_text, 0, 0.0, None, None, None)
                return self._json(self._made(running, sent, text, reasoning, new_text, calls), self._template)
        else:
            new_text = text[sent.chars:]
        if not new_text:
            return ""
        sent.chars, sent.tokens = len(text), 0
        return _templated(self._template, 0, new_text)

    def _json(self, delta: Delta, template: tuple[str, str, str]) -> str:
        if delta.first or delta.reasoning or delta.tool_calls:
            return json_text(self._chunk(delta), separators=(",", ":"))
        if delta.finish_reason is None:
            return _templated(template, delta.index, delta.text)
        if not delta.text:  # a choice's last chunk (`_choice_deltas`'s: its reason alone)
            after_index, after_reason = self._finish
            return f"{template[0]}{delta.index}{after_index}{json_text(delta.finish_reason)}{after_reason}"
        return json_text(self._chunk(delta), separators=(",", ":"))

    def _deltas(self, choices: Sequence[RequestProgress]) -> Iterator[Delta]:
        self.latest = choices
        for p in choices:
            sent = self.sent[p.choice]
            if not sent.ended:
                yield from self._choice_deltas(p, sent)

    def _choice_deltas(self, p: RequestProgress, sent: _Sent) -> Iterator[Delta]:
        delta = self._delta(p, sent)
        if delta is not None:
            yield delta
        if p.status.is_finished:
            sent.ended = True
            called = self.readings[p.choice].called
            yield Delta(p.choice, finish_reason=finish_reason(p.finish_reason, called))

    def closing(self, final: Sequence[RequestProgress]) -> Iterator[dict]:
        """After every choice ended: the usage chunk, when asked for."""
        if self.online.stream_options.include_usage:
            figures = usage([choice_of(p) for p in final], self.answer)
            yield usage_chunk(self.endpoint, self.answer_id, self.created, self.model, figures)

    def _delta(self, p: RequestProgress, sent: _Sent) -> Delta | None:
        text = p.visible_text
        new_text, reasoning, calls = text[sent.chars:], "", []
        if self.endpoint is Endpoint.CHAT:
            reasoning, new_text, calls = self.readings[p.choice].step(text, p.status.is_finished)
        return self._made(p, sent, text, reasoning, new_text, calls)

    def _made(self, p: RequestProgress, sent: _Sent, text: str, reasoning: str, new_text: str,
              calls: list[dict]) -> Delta | None:
        """The delta of a choice's new reading (None when it shows nothing new); what the client has
        moves on to it."""
        shows_tokens = self.answer.logprobs or self.answer.token_ids
        count = len(p.tokens) if p.status.is_finished or len(text) > sent.chars else sent.tokens
        if not (new_text or reasoning or calls) and not (shows_tokens and count > sent.tokens):
            return None
        prefix = ""
        if not sent.started:
            sent.started = True
            prompt = self.online.specs[p.choice].prompt
            prefix = prompt if self.answer.echo and prompt else ""
            sent.offset = len(prefix)
        delta = Delta(p.choice, text=prefix + new_text, logprobs=tuple(p.logprobs[sent.tokens:count]),
                      tokens=tuple(p.tokens[sent.tokens:count]), text_offset=sent.offset,
                      reasoning=reasoning, tool_calls=tuple(calls))
        sent.offset += sum(len(t.chosen.text) for t in delta.logprobs)
        sent.chars, sent.tokens = len(text), count
        return delta

    def _chunk(self, delta: Delta) -> dict:
        options = self.online.stream_options
        so_far = None
        if options.continuous_usage:
            so_far = usage([choice_of(p) for p in self.latest], self.answer)
        out = chunk(self.endpoint, self.answer_id, self.created, self.model, delta, self.answer,
                    include_usage=options.include_usage, obfuscation=options.obfuscation,
                    usage_so_far=so_far)
        if self.prompt_ids is not None:
            out["prompt_token_ids"] = self.prompt_ids[0] if self.answer.prompts == 1 else self.prompt_ids
            self.prompt_ids = None
        return out


def _templated(template: tuple[str, str, str], index: int, text: str) -> str:
    """A running choice's text chunk from the stream's template: one JSON escape of the text."""
    head, middle, tail = template
    return f"{head}{index}{middle}{json_string(text)}{tail}"
