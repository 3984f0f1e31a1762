"""RemoteRunner: the scheduler's plans executed by an OpenAI-compatible engine (vLLM).

fsched still decides who runs: the scheduler admits, orders and preempts as
with the built-in runner. The engine executes: every running request is one
streamed `/v1/completions` call whose prompt is token ids (fsched's own
encoding, chat template included) and whose stream returns token ids, so the
tokens fsched stores are exactly the engine's.

How a plan maps onto streams:
- a request that appears in the plan (a prefill chunk, a decode row, a
  resume) and has no stream gets one, with prompt + tokens generated so far
  as its prompt: a fresh start and a resume are the same call;
- a preempted request's stream is aborted; its tokens so far are kept, and
  it resumes later from them (the engine's prefix cache makes that cheap);
- a step returns the tokens that arrived for the requests the plan lets
  produce (several per request when the engine ran ahead); it waits until
  one arrives or its bound passes (the daemon gives one a step: until its
  next timed duty is 50 ms overdue, core/daemon/duties.py; else
  `max_wait_s`), so the daemon loop never spins, then
  gathers the rest of the engine's iteration from the streams already
  sending (a new stream's first token comes at an iteration of the
  engine's choosing: waiting for it held every token of the step back the
  whole window); a first token that arrives ends the gather, to be pushed
  in the pass it came in. A wait that nothing ended gathers nothing: the
  engine is between iterations, and the gather's slices were a wake-up
  each; the next step's wait wakes at the first token and gathers the rest.

How an iteration's tokens arrive behind vLLM (CPU build, tiny model,
`--tokens-only`, 32 streams of 64 tokens, 2 shared cores at load 2.7-9.4; each
chunk's kernel receive time per socket, SO_TIMESTAMPNS, in an instrumented
daemon): one iteration's 32 chunks come within 1.0-1.2 ms (p50; p90 3.0-5.2
ms), 0.3 ms apart at most within the burst (p50), but the API server often
pauses after an iteration's first chunk (typically 2.5 ms, up to 9, a few
times a run 16-27 ms) before writing the other 31; iterations come every
22-61 ms (p50; p90 29-200 ms, the engine slowed by the load and by the
prefills of new requests). So the gather ends when every stream already
sending has news (most steps: 32 tokens), or, once most of them have news,
when nothing has come for `gather_quiet_s` (3 ms: the burst is over, and a
stream left out of it sends its next token 12-70 ms later, with a later
iteration), or at `gather_s` (10 ms) after the wait ended: a quiet spell
while only a few streams have sent is that pause after the first chunk, and
the gather waits on. What keeps the daemon's average below 32 tokens a step
there (8.6-24 in the runs measured) is mostly not the gather: 14-62% of
the steps carried nothing (waits that ran out a fixed 50 ms while the
engine was slower than it, and steps for new work announced); the steps
with tokens carry 23-29 on average (docs/vllm.md). The daemon now bounds a
wait by its next timed duty instead (core/daemon/duties.py), and most of
the empty steps left are those for new work.

Sampling: greedy output is exact across preemptions and restarts (the
engine's next token depends only on the context). A seeded request is
reproducible while it runs uninterrupted; a resume restarts the engine's
generator, with the seed derived from (seed, tokens already generated), so
the output is then a deterministic function of the seed and of the points
where the request was interrupted, not the uninterrupted run's output.

Faults: an engine that goes away (connection refused or reset, 503, a stream
cut short) does not fail anything: the requests keep the tokens they have,
the runner probes the engine with backoff, logs one line when it goes and
one when it is back, and reopens their streams. A request the engine
refuses (its own error answer, e.g. a prompt over its context) fails alone
with the engine's message.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fsched.core.runners.openai_http import EngineClient, Fault
from fsched.core.runners.outage import Outage
from fsched.core.runners.protocol import LiveRequest, Runner, RunResult
from fsched.core.runners.registered import Registered, output_text, register
from fsched.core.runners.stopping import check_stop
from fsched.core.runners.streams import Stream
from fsched.core.sched.plan import Outcome, Plan
from fsched.core.stamps import stamp
from fsched.core.types import (
    LOGIT_BIAS_RANGE,
    LOGPROB_FLOOR,
    Logprob,
    RequestClass,
    RequestId,
    RequestStatus,
    ResponseFormat,
    ResponseFormatType,
    SamplingParams,
    StopCheck,
    TokenLogprobs,
)

log = logging.getLogger("fsched.daemon")

MAX_ENGINE_SEED = 2**31 - 1


@dataclass(slots=True, frozen=True)
class Codec:
    """What the runner needs of the model's tokenizer: text of ids, end-of-sequence ids, context,
    and the prompt's ids (fsched applies the chat template; the engine only sees token ids)."""

    decode: Callable[[list[int]], str]
    eos_token_ids: frozenset[int]
    context_length: int
    encode: Callable[..., list[int]] | None = None  # (prompt, messages, render=None)
    decode_special: Callable[[list[int]], str] | None = None  # keeping special tokens (else `decode`)


def resume_seed(seed: int | None, generated: int) -> int | None:
    """The engine seed of a stream that starts after `generated` tokens: the request's own at 0."""
    if seed is None or generated == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{generated}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % MAX_ENGINE_SEED


def replays(params: SamplingParams) -> bool:
    """Whether a resume re-runs the request from its prompt (the engine regenerating, and fsched
    checking, the tokens it has) instead of continuing from prompt + tokens: a grammar's state
    cannot be handed to the engine, so structured output must start where its JSON starts."""
    return params.response_format is not None


def completion_body(model: str, context: list[int], params: SamplingParams, generated: int,
                    context_length: int, output: Sequence[int] = ()) -> dict:
    """The `/v1/completions` request that continues a request from `context`, in vLLM's names.

    `generated` tokens of the output are already in `context` (`output` lists
    them): max_tokens and min_tokens count what is left, and the frequency and
    presence penalties they earned travel as logit_bias (the engine counts
    only its own request's output).
    """
    room = context_length - len(context)
    body = {
        "model": model,
        "prompt": list(context),
        "max_tokens": max(1, min(params.max_tokens - generated, room)),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "return_token_ids": True,
    }
    if params.top_k > 0:
        body["top_k"] = params.top_k
    # Greedy ignores the seed; it is passed unchanged (a stand-in engine may use it).
    seed = params.seed if params.greedy else resume_seed(params.seed, generated)
    if seed is not None:
        body["seed"] = seed
    body.update(_sampling_fields(params, generated, output))
    return body


def _sampling_fields(params: SamplingParams, generated: int, output: Sequence[int]) -> dict:
    fields: dict = {}
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("repetition_penalty", 1.0), ("min_p", 0.0)):
        if getattr(params, name) != neutral:
            fields[name] = getattr(params, name)
    if params.min_tokens > generated:
        fields["min_tokens"] = params.min_tokens - generated
    if params.ignore_eos:
        fields["ignore_eos"] = True
    if params.stop_token_ids:
        fields["stop_token_ids"] = list(params.stop_token_ids)
    bias = dict(params.logit_bias)
    if output and (params.frequency_penalty or params.presence_penalty):
        counts: dict[int, int] = {}
        for token in output:
            counts[token] = counts.get(token, 0) + 1
        for token, n in counts.items():
            bias[token] = bias.get(token, 0.0) - params.frequency_penalty * n - params.presence_penalty
    if bias:
        low, high = LOGIT_BIAS_RANGE
        fields["logit_bias"] = {str(t): min(high, max(low, b)) for t, b in sorted(bias.items())}
    if params.logprobs is not None:
        fields["logprobs"] = params.logprobs
        fields["return_tokens_as_token_ids"] = True
    if params.response_format is not None:
        fields["response_format"] = _response_format(params.response_format)
    return fields


def _response_format(fmt: ResponseFormat) -> dict:
    if fmt.type is ResponseFormatType.JSON_OBJECT:
        return {"type": "json_object"}
    schema = {"name": fmt.name or "response", "schema": fmt.schema_object}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


def chunk_logprobs(chunks: Sequence[tuple[dict, int]], decode: Callable[[list[int]], str], top: int
                   ) -> list[TokenLogprobs]:
    """The logprobs of the tokens of several chunks, each (its `logprobs` object, its token count)."""
    out: list[TokenLogprobs] = []
    for raw, count in chunks:
        out += event_logprobs(raw, count, decode, top)
    return out


def event_logprobs(raw: dict | None, count: int, decode: Callable[[list[int]], str], top: int
                   ) -> list[TokenLogprobs]:
    """The `count` tokens' logprobs from a completions chunk's `logprobs` object (tokens written
    `token_id:N`, as `return_tokens_as_token_ids` asks), the `top` likeliest alternatives each."""
    raw = raw or {}
    ids = [_token_id(t) for t in raw.get("tokens") or ()]
    lps = list(raw.get("token_logprobs") or ())
    tops = list(raw.get("top_logprobs") or ())

    def logprob(token: int, value: float | None) -> Logprob:
        return Logprob(token, _floor(value), decode([token]) if token >= 0 else "")

    out = []
    for i in range(count):
        chosen = logprob(ids[i] if i < len(ids) else -1, lps[i] if i < len(lps) else None)
        offered = (tops[i] if i < len(tops) else None) or {}
        alternatives = sorted(((_token_id(t), lp) for t, lp in offered.items()), key=lambda x: -_floor(x[1]))
        out.append(TokenLogprobs(chosen, tuple(logprob(t, lp) for t, lp in alternatives[:top])))
    return out


def _token_id(text: str) -> int:
    if isinstance(text, str) and text.startswith("token_id:"):
        return int(text.removeprefix("token_id:"))
    return -1


def _floor(logprob: float | None) -> float:
    return LOGPROB_FLOOR if logprob is None or logprob != logprob else max(LOGPROB_FLOOR, float(logprob))


@dataclass(slots=True, frozen=True)
class EngineApi:
    """One way of asking the engine for a streamed continuation: its path, the request body that
    continues a request (`completion_body`'s arguments), and how a stream's `logprobs` objects read
    (`chunk_logprobs`'s). Both ways stream server-sent events whose one choice carries `token_ids` and
    `finish_reason`, ending with `data: [DONE]`, so one stream reader serves both."""

    name: str
    path: str
    body: Callable[..., dict]
    logprobs: Callable[[Sequence[tuple[dict, int]], Callable[[list[int]], str], int], list[TokenLogprobs]]
    chunked: Callable[[dict, int], dict]  # the body asking for `n` tokens a chunk after the first


def chunked_completion(body: dict, n: int) -> dict:
    """A completions body whose stream sends `n` tokens a chunk after the first (vLLM's `stream_interval`;
    the first and the last chunk come at once). vLLM ignores fields it does not know; an engine that refuses
    this one is asked for single tokens from then on (`RemoteRunner._unchunked`)."""
    return {**body, "stream_interval": n}


# vLLM's OpenAI completions, with token-id prompts and `return_token_ids`: what any OpenAI-compatible
# engine that takes token ids serves (the engine detokenizes every token it streams, unused here).
COMPLETIONS = EngineApi("completions", "/v1/completions", completion_body, chunk_logprobs, chunked_completion)


@dataclass(slots=True, eq=False)
class _Request(Registered):
    """The record (its output: the tokens reported to the scheduler), and its stream's state."""

    stream: Stream | None = None  # the open stream; what an older one sends is never read
    pending: list[int] = field(default_factory=list)  # arrived, not yet reported
    ended: str | None = None  # the engine's finish reason: no more tokens will come
    error: str | None = None  # the engine refused it
    pending_logprobs: list[TokenLogprobs] = field(default_factory=list)  # of `pending`, when asked for
    replay: list[int] = field(default_factory=list)  # tokens the open stream must regenerate first
    stops: frozenset[int] = frozenset()  # the tokens that end it (past min_tokens)
    flowing: bool = False  # its open stream has sent tokens: each engine iteration brings it one
    interval: int = 1  # tokens its stream's chunks carry (after the first): a batch stream's are several


def _first_token_waits(r: _Request) -> bool:
    """Whether a request's first token has arrived and is not reported yet (its time to first token
    runs until the step that reports it ends)."""
    return bool(r.pending) and not r.request.output


class RemoteRunner(Runner):
    """The Runner protocol over a remote engine's streamed completions."""

    def __init__(self, client: EngineClient, codec: Codec, model: str, max_wait_s: float = 0.05,
                 gather_s: float = 0.010, gather_slice_s: float = 0.002, gather_quiet_s: float = 0.003,
                 backoff_s: tuple[float, float] = (0.5, 8.0), api: EngineApi = COMPLETIONS,
                 batch_stream_interval: int = 1):
        if batch_stream_interval < 1:
            raise ValueError("batch_stream_interval must be >= 1")
        self.client = client
        self.batch_stream_interval = batch_stream_interval
        self.codec = codec
        self.model = model
        self.api = api
        self.max_wait_s = max_wait_s
        self.gather_s = gather_s
        self.gather_slice_s = gather_slice_s
        self.gather_quiet_s = gather_quiet_s
        self._streams = client.streams(api.path)
        self._requests: dict[RequestId, _Request] = {}
        self._wait_s: float | None = None  # the next step's wait bound, when its caller gave one
        self.outage = Outage(backoff_s)  # the engine's absences (its requests keep their tokens meanwhile)
        self.streams_opened = 0
        self.resumes = 0  # streams opened after tokens were generated (preemption, outage, restart)

    # -- requests ----------------------------------------------------------------------
    def add(self, request: LiveRequest) -> None:
        r = register(self._requests, _Request, request, self.codec.decode)
        r.stops = r.rules.stop_token_ids | (frozenset() if r.rules.ignore_eos else self.codec.eos_token_ids)
        if getattr(request, "request_class", None) is RequestClass.BATCH:
            r.interval = self.batch_stream_interval

    def release(self, request_id: RequestId) -> None:
        r = self._requests.pop(request_id, None)
        if r is not None:
            self._close(r)

    def redraws(self, request: LiveRequest) -> bool:
        """A sampled request continued after a restart is drawn under another seed (`resume_seed`):
        the engine's draws cannot be replayed from a position."""
        return not request.params.greedy

    def text(self, request: LiveRequest) -> str:
        """The output text, without a final EOS and cut before a stop string that ended it."""
        special = not request.params.skip_special_tokens and self.codec.decode_special is not None
        return output_text(request, self.codec.eos_token_ids,
                           self.codec.decode_special if special else self.codec.decode,
                           self._requests.get(request.id))

    @property
    def kv_tokens(self) -> int:
        """Tokens the engine holds for fsched: the context of every open stream (a chunked stream's up to
        a chunk ahead of what it sent)."""
        return sum(r.context + len(r.pending) + r.interval - 1 for r in self._requests.values()
                   if r.stream is not None)

    # -- one step ------------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        return self.codec.context_length

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               render: dict | None = None) -> list[int]:
        if self.codec.encode is None:
            raise ValueError("this runner was given no tokenizer to encode prompts with")
        return self.codec.encode(prompt, messages, render)

    def run(self, plan: Plan) -> RunResult:
        start = time.perf_counter()
        for p in plan.preempted:
            if (r := self._requests.get(p.request_id)) is not None:
                self._close(r)
        self._probe_if_down()
        requests = self._requests
        for rid in (*plan.resumed, *(c.request_id for c in plan.prefill)):
            self._open(requests[rid])
        for rid in plan.decode:  # most decode rows have their stream: asked here, not in a call each
            if (r := requests[rid]).stream is None:
                self._open(r)
        producing = plan.producing()
        self._await(set(producing), start)
        result = RunResult(outcome=Outcome(elapsed_s=0.0))
        produced: dict[RequestId, int] = {}
        for rid in producing:
            r = requests[rid]
            news = r.pending or r.ended is not None or r.error is not None or r.request.stop is not None
            produced[rid] = self._deliver(r, result) if news else 0
        result.outcome = Outcome(elapsed_s=time.perf_counter() - start, finished=frozenset(result.finished),
                                 produced=produced)
        return result

    def _open(self, r: _Request) -> None:
        request = r.request
        if r.stream is not None or r.ended or request.stop or r.error or self.outage.down_since is not None:
            return
        generated = len(request.output)
        if generated and replays(request.params):
            r.replay = list(request.output)
            body = self.api.body(self.model, list(request.prompt), request.params, 0, self.context_length)
        else:
            r.replay = []
            body = self.api.body(self.model, r.tokens(), request.params, generated, self.context_length,
                                   request.output)
        r.interval = min(r.interval, self.batch_stream_interval)
        if r.interval > 1:
            body = self.api.chunked(body, r.interval)
        r.pending.clear()
        r.pending_logprobs.clear()
        r.flowing = False
        r.stream = self._streams.open(body, r, plain=r.params.logprobs is None)
        stamp("opened", request.job_id)
        self.streams_opened += 1
        self.resumes += generated > 0
        if r.stream.ended:  # it could not even connect
            self._apply(r.stream)

    def _close(self, r: _Request) -> None:
        """Abort the stream, keeping the tokens reported; unreported ones come again on resume."""
        if r.stream is not None:
            self._streams.abort(r.stream)
            r.stream = None
        r.pending.clear()
        r.ended = None

    def wake_on(self, fd: int) -> None:
        """End a step's wait for tokens when `fd` becomes readable (new work for the daemon to claim)."""
        self._streams.wake_on(fd)

    def wait_at_most(self, seconds: float) -> None:
        """Bound the next step's wait for tokens by `seconds` (the daemon's next timed duty:
        core/daemon/duties.py) instead of `max_wait_s`."""
        self._wait_s = seconds

    def _await(self, producing: set[RequestId], start: float) -> None:
        """Apply what arrived; wait (up to the bound the step was given, else `max_wait_s`) until a
        producing request has news, or the wake descriptor says the daemon has work to take first;
        then, if any came, `_gather`."""
        bound, self._wait_s = (self.max_wait_s if self._wait_s is None else self._wait_s), None
        streams, requests = self._streams, self._requests
        self._take(streams.poll(0.0), set())
        # The producing requests without news yet: what arrives takes them out (one pass here, not one
        # over all of them at every poll; `_has_news` spelled out: a call a row was most of its cost).
        missing = {rid for rid in producing
                   if not ((r := requests[rid]).pending or r.ended is not None or r.error is not None)}
        down = self.outage.down_since is not None
        if len(missing) == len(producing) and not streams.woken and (
                down or any(requests[rid].stream is not None for rid in producing)):
            deadline = start + bound
            if down:
                deadline = min(deadline, max(self.outage.next_probe, time.perf_counter()))
            while (left := deadline - time.perf_counter()) > 0:
                if self._take(streams.poll(left), missing) or streams.woken:
                    break
        if streams.woken:
            return  # the daemon claims first; what else arrived is read at the next step
        arrived = [requests[rid] for rid in producing if rid not in missing]
        # (streams that bring a whole iteration at a time have nothing more of it to gather)
        gathers = self.gather_s and arrived and not streams.whole_iterations
        if gathers and not any(map(_first_token_waits, arrived)):
            self._gather({rid for rid in missing if requests[rid].flowing}, len(arrived))

    def _gather(self, awaited: set[RequestId], arrived: int) -> None:
        """Read the rest of the iteration a slice at a time (a poll woken by each stream in turn would
        cost a system call per token) until each `awaited` request has news, or:
        - the iteration's burst is over: most of the streams (`arrived` have news already, `awaited`
          still lack it) have news and nothing came for `gather_quiet_s`. What is still missing then
          comes with a later iteration (vLLM writes one iteration's chunks within a millisecond or
          two; a stream left out of a burst sent its token before it or sends the next one 12-70 ms
          later), so waiting on held the burst's tokens back for nothing. While only a few have news
          a quiet spell does not end it: vLLM's API server often pauses after an iteration's first
          chunk (typically 2.5 ms, up to 9, at times 16-27) before writing the others;
        - `gather_s` has passed;
        - a first token came (pushed in this pass; the rest is read at the next step);
        - new work is announced (the pause between two slices watches the wake descriptor: an
          announcement ends it at once, so the daemon claims the new work without waiting out the
          slice)."""
        streams = self._streams
        now = last = time.perf_counter()
        deadline = now + self.gather_s
        flowing = len(awaited) + arrived
        while awaited and not streams.woken and (left := deadline - now) > 0:
            if streams.pause(min(self.gather_slice_s, left)):
                return  # new work: the daemon claims it now, not a slice later
            news = streams.poll(0.0)
            self._take(news, awaited)
            now = time.perf_counter()
            if news:
                if any(_first_token_waits(stream.owner) for stream in news):
                    return
                last = now
            elif 2 * len(awaited) < flowing and now - last >= self.gather_quiet_s:
                return  # the burst is over; the missing few come with a later iteration

    def _take(self, news: list[Stream], missing: set[RequestId]) -> bool:
        """Apply the streams' news; take the requests it gives news out of `missing`; whether any."""
        found = False
        for stream in news:
            self._apply(stream)
            r = stream.owner
            if r.id in missing and self._has_news(r):
                missing.discard(r.id)
                found = True
        return found

    @staticmethod
    def _has_news(r: _Request) -> bool:
        return bool(r.pending) or r.ended is not None or r.error is not None

    def _apply(self, stream: Stream) -> None:
        r = stream.owner
        if r.stream is not stream or self._requests.get(r.id) is not r:
            return  # from a stream since aborted, or a request since released
        tokens, chunks = stream.take()
        top = r.request.params.logprobs
        logprobs = self.api.logprobs(chunks, self.codec.decode, top) if top is not None else []
        if tokens:
            # A chunked stream sends only every few iterations: a gather never waits for it.
            r.flowing = r.interval == 1
            if r.replay and not self._replayed(r, tokens, logprobs):
                return
            if not r.pending and not r.request.output:
                stamp("read", r.request.job_id)
            r.pending += tokens
            if logprobs:
                r.pending_logprobs += logprobs
        if not stream.ended:
            return
        stamp("end_read", r.request.job_id)
        if stream.finish is not None and r.replay:
            r.error, r.stream = "the engine ended the output earlier than before the interruption", None
        elif stream.finish is not None:
            r.ended, r.stream = stream.finish, None
        elif stream.fault is Fault.REFUSED and r.interval > 1 and "stream_interval" in (stream.error or ""):
            self._unchunked(stream.error)
            r.stream = None  # opened again, a token a chunk, at its next step
            r.pending.clear()
        elif stream.fault is Fault.REFUSED:
            r.error, r.stream = stream.error, None
            r.pending.clear()
        else:
            r.stream = None
            r.pending.clear()
            self._engine_lost(stream.error or "unavailable")

    def _unchunked(self, error: str | None) -> None:
        """The engine refused the field that asks for several tokens a chunk (an engine other than
        vLLM, or one older than the field, that checks its fields): every stream asks for single
        tokens from now on."""
        if self.batch_stream_interval > 1:
            log.warning("engine %s refuses stream_interval (%s); batch requests get their tokens one a "
                        "chunk from now on", self.client.url, error)
        self.batch_stream_interval = 1  # each request's own interval falls at its next open

    def _replayed(self, r: _Request, tokens: list[int], logprobs: list[TokenLogprobs]) -> bool:
        """Check a replayed stream's tokens against those generated before (consumed from `tokens`);
        False, failing the request, when it diverges."""
        while r.replay and tokens:  # a replayed stream: what it regenerates must be what was generated
            expected, got = r.replay.pop(0), tokens.pop(0)
            del logprobs[:1]
            if got != expected:
                self._streams.abort(r.stream)
                r.error, r.stream = ("the engine did not regenerate the output it had made before the "
                                     "interruption (structured output resumes by replaying it)"), None
                return False
        return True

    def _deliver(self, r: _Request, result: RunResult) -> int:
        """Report the tokens that arrived for a producing request; how many."""
        if r.error is not None:
            result.failed[r.id] = f"the engine refused the request: {r.error}"
            return 0
        request = r.request
        n = take_tokens(r, self.context_length, self.codec.eos_token_ids)
        r.pending.clear()
        r.pending_logprobs.clear()
        if n:
            result.tokens[r.id] = request.output[-1]
        if request.stop is None and r.ended is not None:
            # The engine stopped on its own (its EOS or length): take its word.
            request.stop = StopCheck(RequestStatus.finished_by(r.ended))
        if request.stop is not None:
            self._close(r)
            result.finished[r.id] = request.stop
        return n

    # -- the engine going away and coming back ----------------------------------------------
    def _engine_lost(self, error: str) -> None:
        if not self.outage.began(time.perf_counter()):
            return
        for r in self._requests.values():
            if r.stream is not None:  # a stream that ended keeps its tokens
                self._close(r)
        log.warning("engine %s unavailable (%s); %d request(s) keep their tokens and resume when it is back",
                    self.client.url, error, len(self._requests))

    def _probe_if_down(self) -> None:
        if self.outage.probe_due(time.perf_counter()) and (
                length := self.outage.probed(self.client.healthy(), time.perf_counter())) is not None:
            log.warning("engine %s is back after %.1f s; resuming %d request(s)", self.client.url, length,
                        len(self._requests))


def take_tokens(r: _Request, context_length: int, eos_token_ids: frozenset[int]) -> int:
    """Move a producing request's pending tokens to its output up to the first that ends it (setting
    its `stop`); how many."""
    rules = r.rules
    # Only a stop token or the length can end it within the pending tokens (no stop strings, no
    # logprobs, past min_tokens): then one scan finds where it ends.
    plain = not rules.stop and r.params.logprobs is None and len(r.request.output) + 1 >= rules.min_tokens
    return (_take_plain if plain else _take_each)(r, context_length, eos_token_ids)


def _take_plain(r: _Request, context_length: int, eos_token_ids: frozenset[int]) -> int:
    """Take the pending tokens up to the first that ends the request (what `check_stop` would say of
    each, checked once, at the last one taken); how many."""
    pending = r.pending
    if not pending:
        return 0
    stops, request = r.stops, r.request
    output = request.output
    room = min(request.params.max_tokens - len(output), context_length - r.context)
    n = min(len(pending), max(1, room))
    if stops and not stops.isdisjoint(pending[:n]):
        n = next(i for i, token in enumerate(pending[:n]) if token in stops) + 1
    output += pending[:n] if n < len(pending) else pending
    # the per-token check's question without its text (a plain request has no stop strings to read for)
    check = check_stop(output[-1], len(output), request.params.max_tokens, r.context, context_length,
                       eos_token_ids, None, r.rules)
    if check.finished is not None:
        request.stop = check
    return n


def _take_each(r: _Request, context_length: int, eos_token_ids: frozenset[int]) -> int:
    """Take the pending tokens (and their logprobs) one at a time, each checked for a stop; how many."""
    request = r.request
    output = request.output
    n = 0
    for i, token in enumerate(r.pending):
        output.append(token)
        if request.params.logprobs is not None and i < len(r.pending_logprobs):
            request.output_logprobs.append(r.pending_logprobs[i])
        n += 1
        if r.text is not None:
            r.text.extend(output)
        check = check_stop(token, len(output), r.params.max_tokens, r.context, context_length,
                           eos_token_ids, r.text, rules=r.rules)
        if check.finished is not None:
            request.stop = check
            break
    return n
