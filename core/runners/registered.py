"""What a runner keeps of each request it runs, and the one way a request joins a runner.

A request's tokens (prompt, then output), sampling parameters, output
logprobs and what ended it live on its live record (`LiveRequest`), which
the runner is handed and keeps a reference to; it keeps no copy of them. An
entry adds what the runner derives from the record to check the output:
its stop rules (the parameters' stop tokens and strings as sets and tuples)
and, when stop strings may end it, the output text read so far (`StopText`,
which decodes only each new token and a window before it), and the output
text as it is shown (`Detokenizer`, the same way). These depend on
the runner's tokenizer, which the record knows nothing of, and are rebuilt
from the record when a request joins a runner again (a resume reads the
output from before it once), so keeping them here loses nothing. Each
runner's entry adds its device state (a KV cache position, a grammar's
state, a stream).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, MutableMapping
from dataclasses import dataclass
from typing import TypeVar

from fsched.core.runners.detokenize import Detokenizer
from fsched.core.runners.protocol import LiveRequest
from fsched.core.runners.stopping import StopRules, StopText, stop_rules
from fsched.core.types import RequestId, SamplingParams


@dataclass(slots=True, eq=False)
class Registered:
    request: LiveRequest  # the live record: read here, its output appended by the runner's step
    rules: StopRules
    text: StopText | None = None  # the output text read so far, when stop strings may end it
    shown: Detokenizer | None = None  # the output text as written and pushed, read as it grows

    @property
    def id(self) -> RequestId:
        return self.request.id

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def context(self) -> int:
        """Prompt plus output tokens."""
        return len(self.request.prompt) + len(self.request.output)

    @property
    def last(self) -> int:
        """The context's last token (what a decode step feeds)."""
        return (self.request.output or self.request.prompt)[-1]

    def tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        """The context's tokens [start:end] (prompt, then output)."""
        prompt, output = self.request.prompt, self.request.output
        end = len(prompt) + len(output) if end is None else end
        if end <= len(prompt):
            return list(prompt[start:end])
        return [*prompt[start:], *output[max(0, start - len(prompt)) : end - len(prompt)]]


def output_text(request: LiveRequest, eos_token_ids: Collection[int],
                decode: Callable[[list[int]], str], entry: Registered | None = None) -> str:
    """A request's output text: without the stop token that ended it (unless the request keeps it) or a
    final EOS (unless it ignores EOS), and cut before a stop string that ended it. With the runner's
    `entry` for it, only the tokens since the last call are decoded (a request's `decode` is always
    the same one)."""
    tokens, stop, params = request.output, request.stop, request.params
    if stop is not None and stop.on_token and not params.include_stop_str_in_output:
        tokens = tokens[:-1]
    elif tokens and tokens[-1] in eos_token_ids and not params.ignore_eos:
        tokens = tokens[:-1]
    if entry is None:
        text = decode(tokens)
    else:
        if entry.shown is None:
            entry.shown = Detokenizer(decode)
        text = entry.shown.text(tokens)
    if stop is not None and stop.text_end is not None:
        text = text[: stop.text_end]
    return text


Entry = TypeVar("Entry", bound=Registered)


def register(
    requests: MutableMapping[RequestId, Entry], entry: type[Entry], request: LiveRequest,
    decode: Callable[[list[int]], str] | None = None, error: type[Exception] = ValueError, **device,
) -> Entry:
    """Add a request to a runner's `requests` as its `entry` type (with its `device` fields); stop
    strings are read with `decode` (None: the runner reads none). Raises `error` for an id already
    there or an empty prompt."""
    if request.id in requests:
        raise error(f"request {request.id!r} is already in the runner")
    if not request.prompt:
        raise error(f"request {request.id!r} has an empty prompt")
    params = request.params
    text = StopText(params.stop, decode) if params.stop and decode is not None else None
    registered = entry(request, stop_rules(params), text, **device)
    requests[request.id] = registered
    return registered
