"""The runner: what executes the scheduler's plans, as the engine drives it.

The engine owns the order of work and the runner owns the model: the engine
hands the runner a request's live record (`add`), asks for one step at a
time (`run(plan)`), reads the request's text (`text`) and has the runner
forget it (`release`). The torch model runner, the stand-in and a runner
that forwards the work to a remote engine all implement this one protocol,
so the scheduler, the engine and the daemon are the same code over each of
them.

What a request is and what it has produced live on its record
(`LiveRequest`: core/sched/request.py's `Request`), never in a runner's
copy: the runner reads the prompt and the sampling parameters there, and
its step is the one writer of the output (it appends each token, and its
logprobs, and records the stop check that ends it, as it produces and
checks them one after the other). Everyone else reads the record. A runner
keeps, by id, only its device state (KV cache and position, a grammar's
state, an open stream and what arrived on it) and what it derives from the
record to check the output (core/runners/registered.py).

What every runner must hold (the tests of each runner check it):
- Tokens are a function of the request alone: its seed, its prompt and the
  position of the token. Never of the batch it ran in, of the step, or of a
  global random state. So a request resumed after a preemption, a daemon
  restart or on another daemon produces the same tokens.
- Preemption never changes an output: a request parked (KV kept in host
  memory) or dropped (KV recomputed from prompt plus generated tokens) and
  resumed yields exactly what an uninterrupted run would have.
- A request that asks for logprobs (`params.logprobs` not None) has one
  `TokenLogprobs` per output token in `output_logprobs`, kept across
  preemptions and restarts (the claim puts those from before a restart on
  the record).
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

from fsched.core.sched.plan import Outcome, Plan
from fsched.core.types import RequestId, SamplingParams, StopCheck, TokenLogprobs


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
    `finished` maps the requests that stopped in this step to why (the stop
    check the runner also put on each one's record). `failed` maps a request
    the executor refused (a remote engine's error answer, such as a prompt
    over its context) to that message: the request fails alone.
    """

    outcome: Outcome
    tokens: dict[RequestId, int] = field(default_factory=dict)
    finished: dict[RequestId, StopCheck] = field(default_factory=dict)
    failed: dict[RequestId, str] = field(default_factory=dict)


class LiveRequest(Protocol):
    """What a runner reads and writes of a request's live record (core/sched/request.py `Request`;
    a test may hand it any object with these attributes).

    It reads `id`, `prompt` (token ids, at least one), `params` and, where
    the record has one, `request_class` (a remote engine's batch streams come
    in chunks); `output` and `output_logprobs` hold what the request produced
    before it came (a resume after a restart), and the runner's steps append each token it
    produces (and its logprobs, when `params.logprobs` is not None) and set
    `stop` to the check that ended the output. Nothing else writes these
    while the runner holds the request.
    """

    id: RequestId
    prompt: Sequence[int]
    params: SamplingParams
    output: list[int]
    output_logprobs: list[TokenLogprobs]
    stop: StopCheck | None


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

    def add(self, request: LiveRequest) -> None:
        """Take a request's live record: from now on this runner's steps append its output to it.

        Its `output` so far (tokens from before a restart) is where it goes
        on from. Nothing runs yet: its prefill comes in a later plan. Raises
        when its id is already registered, and `RequestRefused` when it cannot
        run here.
        """
        ...

    def run(self, plan: Plan) -> RunResult:
        """One engine step: execute `plan`, append what it produced to the records, report it."""
        ...

    def text(self, request: LiveRequest) -> str:
        """A request's output text as its record holds it: without the stop token that ended it
        (unless kept), cut at the stop string that ended it; registered or not."""
        ...

    def release(self, request_id: RequestId) -> None:
        """Forget a request (finished or cancelled) and free what it holds; unknown ids are ignored."""
        ...


@runtime_checkable
class Redrawing(Protocol):
    """A runner some of whose requests do not resume exactly: an engine fsched does not control
    reseeds a sampled request it continues, so tokens produced but not yet written before a crash
    are drawn again differently. Such tokens must reach the table before anyone sees them."""

    def redraws(self, request: LiveRequest) -> bool:
        """Whether the request's tokens after a resume may differ from those it produced."""
        ...


@runtime_checkable
class Wakeable(Protocol):
    """A runner whose step may wait for its engine (a remote one): a readable `fd` ends that wait,
    so that work to claim does not wait behind tokens to come; `wait_at_most` bounds the next step's
    wait (its caller's next timed duty), else the runner's own bound holds."""

    def wake_on(self, fd: int) -> None: ...

    def wait_at_most(self, seconds: float) -> None: ...


@runtime_checkable
class Preparing(Protocol):
    """A runner whose `add` may need long work first (compiling a request's grammar): `prepare`
    starts it off the caller's thread and returns its future (None when nothing is to wait for); the
    engine adds the request once the future is done, and fails it alone with the future's error."""

    def prepare(self, params: SamplingParams) -> Future | None: ...


__all__ = ["LiveRequest", "Preparing", "RequestRefused", "RunResult", "Runner", "Wakeable"]
