"""One live request, from claim to completion: the record the claim returns and the scheduler, the
engine, the runner and the daemon (its holdings, writer and publisher) all read and update.

It holds what the request is (identity, tenant and class, its prompt as
stored and then its token ids, sampling parameters), what it has produced
(its output tokens and their logprobs, those from before a restart first,
and what ended its output), where it is (one ordered status), the
scheduler's lengths, progress and timers, its first token's time (on the
engine's clock), and the daemon's bookkeeping (the claim's job and lease,
whether output is waiting to be written). A simulated request is the same
record with lengths only (no token ids, no parameters).

Who writes what: the claim fills in what the request is and the output
from before a restart; from the runner's `add` on, the runner's step is the
one writer of `output`, `output_logprobs` and `stop` (it produces each
token and checks it against the stop rules, one at a time, before the next);
the scheduler writes the status, lengths and progress (the engine writes
first why the runner stopped a request, from what the step reports), the
daemon its bookkeeping. Everyone else reads.
A runner keeps, by id, only what it derives from the record for the model
(its device state: KV, positions, a grammar's state, a socket; and the stop
rules and text it checks): see core/runners/registered.py.

Token bookkeeping: `context` is prompt plus generated tokens; `computed` is
how many of them have KV on the device. A decoding request has
`computed == context - 1` (its last token is fed in the next step). A
request whose KV was dropped (recompute) prefills its whole context again,
and the chunk that completes the prefill produces the next token, so the
output is the same as an uninterrupted run.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from fsched.core.types import RequestClass, RequestId, RequestStatus, SamplingParams, StopCheck, TokenLogprobs


class Checkpoint(enum.StrEnum):
    """What happens to a preempted request's KV cache."""

    PARK = "park"  # copied to the host pool, restored on resume
    RECOMPUTE = "recompute"  # dropped; prompt + generated tokens prefilled again


@dataclass(slots=True, eq=False)
class Request:
    id: RequestId
    tenant: str
    request_class: RequestClass
    prompt_tokens: int
    max_tokens: int
    arrival: float
    priority: int = 5  # base priority: 0 most urgent .. 9 least (the priority baseline orders by it)

    # Mutable progress, owned by the scheduler.
    status: RequestStatus = RequestStatus.WAITING
    generated: int = 0
    computed: int = 0
    wait_since: float = 0.0  # when it last started waiting (arrival or preemption)
    run_steps: int = 0  # steps with progress since last admission (minimum quantum)
    idle_steps: int = 0  # consecutive running steps without a prefill chunk
    preemptions: int = 0
    res_gpu: float = 0.0  # usage granted by the tenant meter and not yet used:
    res_kv: float = 0.0  # GPU seconds and KV token-seconds
    seq: int = 0  # admission-order tie-breaker, unique per scheduler
    # First-token timing, set when it starts waiting (lines.stamp): its class's target after its
    # arrival, when that target goes out of reach, when it has waited its aging limit.
    deadline: float = float("inf")
    late_at: float = float("inf")
    aged_at: float = float("inf")

    # What runs: the prompt's token ids and how to sample (empty for a simulated request); what it
    # produced: every output token, the first `resumed_tokens` from before a restart, their logprobs
    # (one a token, when it asks for logprobs), and the stop check that ended its output (None while
    # it runs, or when the scheduler's count of max_tokens ended it). `generated` above is the
    # scheduler's count of the same output (a simulated request has the count only).
    prompt: Sequence[int] = ()
    params: SamplingParams | None = None
    output: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    resumed_tokens: int = 0
    stop: StopCheck | None = None
    # The prompt as the job table keeps it, until the runner's tokenizer encodes it into `prompt`
    # (`encoded`): a completions prompt's text, or a chat's messages and what its template is given
    # besides them (ChatRender.to_json()).
    prompt_text: str | None = None
    messages: list | None = None
    render: dict | None = None

    # Its first token, on the engine's (monotonic) clock: when its wait began (its time in the table
    # included) and when the token came, stamped once by the engine. The daemon turns the time into
    # wall-clock time only where it writes or sends it (core/daemon/holdings.py).
    queued_from: float = 0.0
    first_token_at: float | None = None

    # The daemon's bookkeeping (core/daemon): the claim's job, line, submission time (the table's wall
    # clock), lease epoch and claims so far (this one included); output not yet written back; a server
    # hears it live.
    job_id: int = 0
    custom_id: str = ""
    enqueued_at: float = 0.0
    lease_epoch: int = 0
    attempts: int = 1
    dirty: bool = False
    linked: bool = False
    written_text: str | None = None  # the output text the table holds, as this daemon last wrote it

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 and not self.to_encode:
            raise ValueError("prompt_tokens must be >= 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 <= self.priority <= 9:
            raise ValueError("priority must be within 0..9")

    @classmethod
    def to_run(cls, id: RequestId, prompt: Sequence[int], params: SamplingParams, tenant: str = "default",
               request_class: RequestClass = RequestClass.BATCH, priority: int = 5,
               resumed: Sequence[int] = (), resumed_logprobs: Sequence[TokenLogprobs] = (),
               **daemon) -> Request:
        """A request to run on an engine: its lengths from its token ids (the engine fits `max_tokens`
        to the model's context and stamps `arrival` when it takes it)."""
        request = cls(id, tenant, request_class, len(prompt), params.max_tokens, 0.0, priority,
                      prompt=list(prompt), params=params, **daemon)
        request.resume_from(resumed, resumed_logprobs)
        return request

    @property
    def to_encode(self) -> bool:
        """Claimed with its prompt as stored, not yet encoded into token ids."""
        return not self.prompt and (self.prompt_text is not None or self.messages is not None)

    def encoded(self, prompt: Sequence[int]) -> None:
        """Its prompt's token ids, as the runner's tokenizer encoded the stored prompt."""
        if len(prompt) < 1:
            raise ValueError("prompt_tokens must be >= 1")
        self.prompt, self.prompt_tokens = list(prompt), len(prompt)

    def resume_from(self, tokens: Sequence[int], logprobs: Sequence[TokenLogprobs] = ()) -> None:
        """Continue after `tokens` it produced before (a restart), `logprobs` theirs: its output so far,
        before a runner takes it (the runner goes on from there)."""
        self.output, self.output_logprobs = list(tokens), list(logprobs)
        self.resumed_tokens = self.generated = len(self.output)

    @property
    def resumed(self) -> list[int]:
        """The output tokens it produced before a restart."""
        return self.output[: self.resumed_tokens]

    @property
    def resumed_logprobs(self) -> list[TokenLogprobs]:
        """Their logprobs (when it asks for logprobs)."""
        return self.output_logprobs[: self.resumed_tokens]

    @property
    def latency_sensitive(self) -> bool:
        """Realtime and streaming output is written back every step; batch output, and output a server
        hears over the link already, less often."""
        return self.request_class is not RequestClass.BATCH and not self.linked

    @property
    def parked(self) -> bool:
        """Preempted with its KV kept in the host pool (a recomputed one keeps none: computed is 0)."""
        return self.status is RequestStatus.PREEMPTED and self.computed > 0

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def pending_prefill(self) -> int:
        """Tokens to prefill before the request can decode (0 when decoding)."""
        if self.generated > 0 and self.computed == self.context - 1:
            return 0
        return self.context - self.computed

    @property
    def remaining_tokens(self) -> int:
        """Output tokens left before `max_tokens` stops the request."""
        return self.max_tokens - self.generated
