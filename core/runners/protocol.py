"""The runner: what executes the scheduler's plans, as the engine drives it.

The engine owns the order of work and the runner owns the model: the engine
registers a request (`add`), asks for one step at a time (`run(plan)`),
reads a request's output (`generated`, `text`) and forgets it (`release`).
The torch model runner, the stand-in and a runner that forwards the work to
a remote engine all implement this one protocol, so the scheduler, the
engine and the daemon are the same code over each of them.

What every runner must hold (the tests of each runner check it):
- Tokens are a function of the request alone: its seed, its prompt and the
  position of the token. Never of the batch it ran in, of the step, or of a
  global random state. So a request resumed after a preemption, a daemon
  restart or on another daemon produces the same tokens.
- Preemption never changes an output: a request parked (KV kept in host
  memory) or dropped (KV recomputed from prompt plus generated tokens) and
  resumed yields exactly what an uninterrupted run would have.
- A request that asks for logprobs (`params.logprobs` not None) has one
  `TokenLogprobs` per generated token, kept across preemptions and given
  back to `add` on a resume after a restart.
- `run` executes the plan as `Plan` documents it (checkpoint the preempted,
  restore the resumed, decode, prefill) and raises when the plan does not
  match its state (a bug upstream). A step that raises leaves the runner
  untrusted: the engine releases every request it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from fsched.core.runners.stopping import StopCheck
from fsched.core.sched.plan import Outcome, Plan
from fsched.core.types import RequestId, SamplingParams, TokenLogprobs


class RequestRefused(ValueError):
    """A request a runner cannot run (a token id outside its vocabulary, a grammar that does not
    compile): `add` raises it, and the request fails alone with this message."""


@dataclass(slots=True)
class RunResult:
    """What one `run(plan)` did.

    `tokens` maps each request that produced a token in the step to the last
    token it produced (a runner that computes in place produces exactly one
    for every decode row and every prefill chunk that completes its prefill).
    A runner whose work happens elsewhere may report only the requests whose
    tokens have arrived, and several tokens for one request; it then says so
    in `outcome.produced` (tokens per request), which the scheduler charges.
    `finished` maps the requests that stopped in this step to why; their
    output stays readable until `release`. `failed` maps a request the
    executor refused (a remote engine's error answer, such as a prompt over
    its context) to that message: the request fails alone.
    """

    outcome: Outcome
    tokens: dict[RequestId, int] = field(default_factory=dict)
    finished: dict[RequestId, StopCheck] = field(default_factory=dict)
    failed: dict[RequestId, str] = field(default_factory=dict)


@runtime_checkable
class Runner(Protocol):
    """Executes plans on a model; one instance serves one engine."""

    @property
    def context_length(self) -> int:
        """Tokens a request's prompt plus output may hold at most."""
        ...

    @property
    def kv_tokens(self) -> int:
        """KV tokens held on the device now (what the scheduler's KV budget counts)."""
        ...

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               render: dict | None = None) -> list[int]:
        """Token ids of a completion prompt, or of chat messages (at least one id) through the chat
        template, given `render` (ChatRender.to_json(): tools, template options) too."""
        ...

    def add(
        self, request_id: RequestId, prompt: list[int], params: SamplingParams, generated: Sequence[int] = (),
        logprobs: Sequence[TokenLogprobs] = (),
    ) -> None:
        """Register a request; `generated` are tokens it produced before (a resume after a restart),
        `logprobs` theirs (when the request asks for logprobs).

        Nothing runs yet: its prefill comes in a later plan. Raises when the
        id is already registered.
        """
        ...

    def run(self, plan: Plan) -> RunResult:
        """One engine step: execute `plan` and report what it produced."""
        ...

    def generated(self, request_id: RequestId) -> list[int]:
        """The tokens a registered request has produced so far (from before a restart too)."""
        ...

    def text(self, request_id: RequestId) -> str:
        """A registered request's output text, cut before the stop string that ended it."""
        ...

    def logprobs(self, request_id: RequestId) -> list[TokenLogprobs]:
        """One record per generated token when the request asks for logprobs (`params.logprobs`
        not None), those from before a restart included; empty otherwise."""
        ...

    def release(self, request_id: RequestId) -> None:
        """Forget a request (finished or cancelled) and free what it holds; unknown ids are ignored."""
        ...


@runtime_checkable
class Wakeable(Protocol):
    """A runner whose step may wait for its engine (a remote one): a readable `fd` ends that wait,
    so that work to claim does not wait behind tokens to come."""

    def wake_on(self, fd: int) -> None: ...


@runtime_checkable
class Preparing(Protocol):
    """A runner whose `add` may need long work first (compiling a request's grammar): `prepare`
    starts it off the caller's thread and returns its future (None when nothing is to wait for); the
    engine adds the request once the future is done, and fails it alone with the future's error."""

    def prepare(self, params: SamplingParams) -> Future | None: ...


__all__ = ["Preparing", "RequestRefused", "RunResult", "Runner", "Wakeable"]
