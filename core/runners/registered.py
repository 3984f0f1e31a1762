"""What a runner keeps of each request it runs, and the one way a request joins a runner.

An entry holds what the runner feeds and checks the model with: the tokens (the
prompt, then every generated token, those from before a restart first), the
sampling parameters, the logprobs of what it generated, and what ends it (stop
tokens, stop strings read from the text so far). Each runner's entry adds its
device state to these (a KV cache position, a grammar's state, a stream).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from fsched.core.runners.stopping import StopCheck, StopRules, StopText, stop_rules
from fsched.core.types import RequestId, SamplingParams, TokenLogprobs


@dataclass(slots=True, eq=False)
class Registered:
    id: RequestId
    tokens: list[int]  # prompt, then every generated token
    prompt_len: int
    params: SamplingParams
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per generated token, when asked for
    rules: StopRules = field(default_factory=StopRules)
    text: StopText | None = None  # the output text read so far, when stop strings may end it
    finish: StopCheck | None = None  # what ended it, once something did

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def output_text(self, eos_token_ids: Collection[int], decode: Callable[[list[int]], str]) -> str:
        """The output text: without the stop token that ended it (unless the request keeps it) or a
        final EOS (unless it ignores EOS), and cut before a stop string that ended it."""
        tokens, finish = self.generated, self.finish
        if finish is not None and finish.on_token and not self.params.include_stop_str_in_output:
            tokens = tokens[:-1]
        elif tokens and tokens[-1] in eos_token_ids and not self.params.ignore_eos:
            tokens = tokens[:-1]
        text = decode(tokens)
        if finish is not None and finish.text_end is not None:
            text = text[: finish.text_end]
        return text


Entry = TypeVar("Entry", bound=Registered)


def register(
    requests: MutableMapping[RequestId, Entry], entry: type[Entry], request_id: RequestId,
    prompt: Sequence[int], params: SamplingParams, generated: Sequence[int] = (),
    logprobs: Sequence[TokenLogprobs] = (),
    decode: Callable[[list[int]], str] | None = None, error: type[Exception] = ValueError, **device,
) -> Entry:
    """Add a request to a runner's `requests` as its `entry` type (with its `device` fields): `generated`
    are tokens it produced before (a resume), `logprobs` theirs; stop strings are read with `decode`
    (None: the runner reads none). Raises `error` for an id already there or an empty prompt."""
    if request_id in requests:
        raise error(f"request {request_id!r} is already in the runner")
    if not prompt:
        raise error(f"request {request_id!r} has an empty prompt")
    text = StopText(params.stop, decode, len(prompt)) if params.stop and decode is not None else None
    registered = entry(request_id, [*prompt, *generated], len(prompt), params, list(logprobs),
                       stop_rules(params), text, **device)
    requests[request_id] = registered
    return registered
