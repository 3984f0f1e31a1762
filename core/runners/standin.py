"""A stand-in for the model: deterministic tokens, no torch, configurable step time.

`fsched daemon --model standin` (or `standin:<ms per step>`) serves the job
table with this instead of a language model. It executes the scheduler's
plans exactly as the model runner does (prefill chunks, decode rows, park,
recompute, resume) but a token is a pure function of (seed, prompt, position),
so outputs are reproducible across restarts, preemptions and daemons. It is
what the cluster, chaos and throughput tests run when the model would only
slow them, and what a deployment can use to rehearse its database and
daemons before a GPU is attached.

Faults can be injected (`fail_when`): an exception raised from inside a step,
as a real model raises on a bad input or an out-of-memory error.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from fsched.core.runners.detokenize import Detokenizer
from fsched.core.runners.protocol import LiveRequest, Runner, RunResult
from fsched.core.runners.registered import Registered, register
from fsched.core.runners.stopping import check_stop
from fsched.core.sched.plan import Outcome, Plan
from fsched.core.sched.request import Checkpoint
from fsched.core.types import Logprob, RequestId, TokenLogprobs

STANDIN_SPEC = "standin"
STANDIN_NAME = "fsched-standin (no model)"
STANDIN_VOCAB = 50_000
STANDIN_EOS = 0
STANDIN_CONTEXT = 8192
STANDIN_EOS_IDS = frozenset({STANDIN_EOS})


class StandInError(Exception):
    """A stand-in spec that cannot be parsed."""


def parse_standin(spec: str | None) -> float | None:
    """Step time in seconds when `spec` names the stand-in ("standin" or "standin:5ms"), else None."""
    if spec is None or not (spec == STANDIN_SPEC or spec.startswith(STANDIN_SPEC + ":")):
        return None
    _, _, arg = spec.partition(":")
    if not arg:
        return 0.0
    try:
        ms = float(arg.removesuffix("ms"))
    except ValueError:
        raise StandInError(
            f"{spec!r}: write standin or standin:<ms per step>, e.g. standin:5ms"
        ) from None
    if not 0 <= ms <= 60_000:
        raise StandInError(f"{spec!r}: the step time must be within 0..60000 ms")
    return ms / 1000


def standin_encode(prompt: str | None = None, messages: list[dict] | None = None,
                   render: dict | None = None) -> list[int]:
    """Token ids for a prompt: one per whitespace-separated word (at least one); the stand-in has no
    chat template, so `render` changes nothing."""
    if messages is not None:
        prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    words = (prompt or "").split() or [""]
    return [1 + _hash(word) % (STANDIN_VOCAB - 1) for word in words]


def standin_token(seed: int | None, context: list[int]) -> int:
    """The token after `context`: depends on the seed, the prompt and the position only."""
    return _token_after(seed, len(context), context[-1] if context else 0)


def _token_after(seed: int | None, length: int, last: int) -> int:
    """`standin_token` of a context of `length` tokens that ends with `last`."""
    digest = _hash(f"{seed}|{length}|{last}")
    # About one token in 500 is EOS, so lengths vary as a model's would.
    return STANDIN_EOS if digest % 500 == 0 else 1 + digest % (STANDIN_VOCAB - 1)


def standin_text(tokens: list[int]) -> str:
    return " ".join(f"w{t}" for t in tokens if t != STANDIN_EOS)


def standin_logprobs(token: int, context: list[int], top: int) -> TokenLogprobs:
    """Made-up but consistent logprobs for the stand-in's `token` after `context`: a pure
    function of both, the chosen token the likeliest, the alternatives likeliest first."""
    return _logprobs_after(token, len(context), top)


def _logprobs_after(token: int, length: int, top: int) -> TokenLogprobs:
    """`standin_logprobs` after a context of `length` tokens."""
    digest = _hash(f"lp|{length}|{token}")
    chosen = Logprob(token, -(digest % 1000) / 1000, f" w{token}")
    alternatives = [chosen]
    for i in range(1, top):
        other = 1 + (digest + i * 7919) % (STANDIN_VOCAB - 1)
        alternatives.append(Logprob(other, chosen.logprob - i, f" w{other}"))
    return TokenLogprobs(chosen, tuple(alternatives[:top]))


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(slots=True, eq=False)
class _StandInRequest(Registered):
    """The record, and where its stand-in KV is."""

    computed: int = 0  # context positions whose KV exists (on the device or parked)
    parked: bool = False


class StandInRunner(Runner):
    """The Runner protocol over `standin_token`."""

    def __init__(
        self,
        step_s: float = 0.0,
        context_length: int = STANDIN_CONTEXT,
        fail_when: Callable[[Plan], BaseException | None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.step_s = step_s
        self._context_length = context_length
        self.fail_when = fail_when
        self.sleep = sleep
        self._requests: dict[RequestId, _StandInRequest] = {}

    @property
    def context_length(self) -> int:
        return self._context_length

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               render: dict | None = None) -> list[int]:
        return standin_encode(prompt, messages)

    def add(self, request: LiveRequest) -> None:
        register(self._requests, _StandInRequest, request)

    def release(self, request_id: RequestId) -> None:
        self._requests.pop(request_id, None)

    def text(self, request: LiveRequest) -> str:
        r = self._requests.get(request.id)
        if r is None:
            return standin_text(request.output)
        if r.shown is None:
            r.shown = Detokenizer(standin_text)
        return r.shown.text(request.output)

    @property
    def kv_tokens(self) -> int:
        return sum(r.computed for r in self._requests.values() if not r.parked)

    def run(self, plan: Plan) -> RunResult:
        start = time.perf_counter()
        if self.fail_when is not None and (error := self.fail_when(plan)) is not None:
            raise error
        result = RunResult(outcome=Outcome(elapsed_s=0.0))
        for p in plan.preempted:
            r = self._requests[p.request_id]
            if p.checkpoint is Checkpoint.PARK:
                r.parked = True
            else:
                r.computed = 0
        for rid in plan.resumed:
            self._requests[rid].parked = False
        for rid in plan.decode:
            self._emit(rid, result)
        for chunk in plan.prefill:
            r = self._requests[chunk.request_id]
            r.computed = chunk.start + chunk.tokens
            if chunk.produces_token:
                self._emit(chunk.request_id, result)
        if self.step_s:
            self.sleep(self.step_s)
        result.outcome = Outcome(elapsed_s=time.perf_counter() - start, finished=frozenset(result.finished))
        return result

    def _emit(self, rid: RequestId, result: RunResult) -> None:
        r = self._requests[rid]
        request, params = r.request, r.request.params
        context = r.context
        token = _token_after(params.seed, context, r.last)
        if params.logprobs is not None:
            request.output_logprobs.append(_logprobs_after(token, context, params.logprobs))
        request.output.append(token)
        r.computed = context
        result.tokens[rid] = token
        check = check_stop(token, len(request.output), params.max_tokens, context + 1, self.context_length,
                           STANDIN_EOS_IDS)
        if check.finished is not None:
            request.stop = result.finished[rid] = check
