"""A stand-in runner whose answers are scripted: what a test wants the model to write, character by
character, chosen from the conversation the request carries.

The tiny model with random weights never decides to call a tool; this runner does, so `auto` tool
choice, the parsers, the streamed deltas and an agent's loop run end to end. `reply(messages, render)`
gives the text of an answer (render: the tools and template options the request was rendered with;
forced: a required or named call, whose answer the grammar would hold to a JSON array of calls).
Each character is one token (its code point + 1; 0 is the end), so a stream splits the text at
every place a flush happens to fall.
"""

from __future__ import annotations

from collections.abc import Callable

from fsched.core.runners.protocol import LiveRequest, RunResult
from fsched.core.runners.standin import STANDIN_EOS, StandInRunner, standin_encode
from fsched.core.runners.stopping import check_stop
from fsched.core.types import RequestId

Reply = Callable[[list[dict], dict | None, bool], str]


class ScriptedRunner(StandInRunner):
    def __init__(self, reply: Reply, **options):
        super().__init__(**options)
        self.reply = reply
        self.prompts: dict[tuple[int, ...], tuple[list[dict], dict | None]] = {}
        self.scripts: dict[RequestId, str] = {}
        self.rendered: list[tuple[list[dict] | None, dict | None]] = []  # what each encode was given

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               render: dict | None = None) -> list[int]:
        self.rendered.append((messages, render))
        ids = standin_encode(prompt, messages)
        ids.append(len(self.prompts) + 1)  # one prompt, one script
        self.prompts[tuple(ids)] = (messages or [], render)
        return ids

    def text(self, request: LiveRequest) -> str:
        return "".join(chr(t - 1) for t in request.output if t != STANDIN_EOS)

    def _emit(self, rid: RequestId, result: RunResult) -> None:
        r = self._requests[rid]
        request = r.request
        if rid not in self.scripts:
            messages, render = self.prompts[tuple(request.prompt)]
            self.scripts[rid] = self.reply(messages, render, r.params.response_format is not None)
        script = self.scripts[rid]
        done = len(request.output)
        token = ord(script[done]) + 1 if done < len(script) else STANDIN_EOS
        r.computed = r.context
        request.output.append(token)
        result.tokens[rid] = token
        check = check_stop(token, len(request.output), r.params.max_tokens, r.context, self.context_length,
                           frozenset({STANDIN_EOS}))
        if check.finished is not None:
            request.stop = result.finished[rid] = check
