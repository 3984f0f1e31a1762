"""ModelRunner: executes the scheduler's plans on a Hugging Face causal LM.

One `run(plan)` is one engine step, in the order the plan promises (see
core/sched/plan.py): checkpoint the preempted (park their KV in host memory, or
drop it for recompute), restore the resumed, decode one token for every row
of the batch, then run the prefill chunks; a chunk that completes its
prefill yields the request's next token and its KV joins the batch.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from llguidance import LLMatcher
from transformers import DynamicCache

from fsched.core.grammar import GrammarError, GrammarSource
from fsched.core.runners.hf.grammar import Grammars
from fsched.core.runners.hf.kvbatch import BatchKV, ParkedKV, RowGroup, cache_from_layers, layers_of
from fsched.core.runners.hf.model import LoadedModel, encode_prompt
from fsched.core.runners.hf.sampling import Row, choose_tokens
from fsched.core.runners.hf.tokenizer import decoder
from fsched.core.runners.protocol import LiveRequest, RequestRefused, Runner, RunResult
from fsched.core.runners.registered import Registered, output_text, register
from fsched.core.runners.stopping import check_stop
from fsched.core.sched.plan import Outcome, Plan, PrefillChunk
from fsched.core.sched.request import Checkpoint
from fsched.core.types import Logprob, RequestId, RequestStatus, SamplingParams, StopCheck, TokenLogprobs


def grammar_failure(matcher: LLMatcher) -> str:
    """Why a request's grammar failed mid-answer (the grammar library's own limits): the request fails
    with this, never ends as if its output were complete."""
    return f"response_format: the grammar failed mid-answer: {matcher.get_error().splitlines()[0]}"


class RunnerError(Exception):
    """The runner was asked for something its state does not allow (a bug upstream)."""


@dataclass(slots=True, eq=False)
class _ModelRequest(Registered):
    """The record, and the model's state of it beside its KV (which the runner keeps by id)."""

    grammar: LLMatcher | None = None  # structured output: the grammar's state after the output
    prompt_ids: torch.Tensor | None = None  # distinct prompt ids on the device, for the repetition penalty

    def row(self, device: torch.device, end_ids: tuple[int, ...]) -> Row:
        """What the sampler needs of this request for its next token."""
        request = self.request
        p = request.params
        if p.repetition_penalty != 1.0 and self.prompt_ids is None:
            self.prompt_ids = torch.tensor(sorted(set(request.prompt)), device=device)
        return Row(p, len(request.output), request.output if p.penalized else (),
                   self.prompt_ids, end_ids if p.min_tokens else ())


@dataclass(slots=True)
class _Parked:
    kv: ParkedKV
    in_batch: bool  # decoding (joins the batch) or mid-prefill (resumes its prefill)


@dataclass(slots=True)
class _Prefilling:
    """A prompt whose prefill runs in chunks: its own cache until the last chunk joins the batch."""

    cache: DynamicCache
    computed: int  # context positions whose KV the cache holds


class ModelRunner(Runner):
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        # Parked KV lives in host memory; pinned on a GPU so the copy back is fast.
        self.host = torch.device("cpu")
        self.batch = BatchKV(self.device)
        self._requests: dict[RequestId, _ModelRequest] = {}
        self._prefilling: dict[RequestId, _Prefilling] = {}
        self._parked: dict[RequestId, _Parked] = {}
        self.vocab_size = int(getattr(self.model.config, "vocab_size", 0) or len(loaded.tokenizer))
        self.grammars = Grammars(loaded.tokenizer, self.vocab_size, sorted(loaded.eos_token_ids))
        self._pieces: dict[int, str] = {}  # a token's own text, for logprobs
        # decode(ids) by skip_special_tokens: the tokenizer's backend where that gives transformers' text
        self._decoders = {skip: decoder(loaded.tokenizer, skip_special_tokens=skip) for skip in (True, False)}
        self.parks = 0  # checkpoints kept in host memory
        self.recomputes = 0  # checkpoints dropped, to be recomputed

    # -- requests ----------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        return self.loaded.context_length

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               render: dict | None = None) -> list[int]:
        return encode_prompt(self.loaded, prompt, messages, render)

    def prepare(self, params: SamplingParams) -> Future | None:
        """The compile `add` needs for this request's grammar, started off the caller's thread; None
        when there is none to wait for (no grammar, or compiled already)."""
        if params.response_format is None:
            return None
        return self.grammars.prepare(GrammarSource.of(params.response_format))

    def add(self, request: LiveRequest) -> None:
        """Take a request's record; its output so far (a resume) is where it goes on from."""
        if request.id in self._requests:
            raise RunnerError(f"request {request.id!r} is already in the runner")
        if not request.prompt:
            raise RunnerError(f"request {request.id!r} has an empty prompt")
        params = request.params
        outside = [t for t, _ in params.logit_bias if t >= self.vocab_size]
        if outside:
            raise RequestRefused(f"logit_bias names token {outside[0]}, outside the vocabulary "
                                 f"(0..{self.vocab_size - 1})")
        grammar = None
        if params.response_format is not None:
            try:
                grammar = self.grammars.matcher(GrammarSource.of(params.response_format), request.output)
            except GrammarError as exc:
                raise RequestRefused(str(exc)) from None
        register(self._requests, _ModelRequest, request, self._decoders[True], RunnerError, grammar=grammar)

    @torch.inference_mode()
    def release(self, request_id: RequestId) -> None:
        """Forget a request (finished or cancelled) and free everything it holds."""
        self._requests.pop(request_id, None)
        self._prefilling.pop(request_id, None)
        self._parked.pop(request_id, None)
        self.batch.remove({request_id})

    def text(self, request: LiveRequest) -> str:
        """The output text, cut before a stop string that ended it."""
        decode = self._decoders[bool(request.params.skip_special_tokens)]
        return output_text(request, self.loaded.eos_token_ids, decode, self._requests.get(request.id))

    @property
    def kv_tokens(self) -> int:
        """KV tokens on the device: the batch's rows and the partial prefills."""
        return self.batch.tokens + sum(p.computed for p in self._prefilling.values())

    # -- one step ------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, plan: Plan) -> RunResult:
        start = time.perf_counter()
        result = RunResult(outcome=Outcome(elapsed_s=0.0))
        self._checkpoint(plan)
        self._restore(plan.resumed)
        if plan.decode:
            self._decode(plan.decode, result)
        if plan.prefill:
            self.batch.add(self._prefill(plan.prefill, result))
        if result.finished or result.failed:
            # Finished and failed rows leave at once; their requests stay until released.
            self.batch.remove(set(result.finished) | set(result.failed))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        result.outcome = Outcome(elapsed_s=time.perf_counter() - start, finished=frozenset(result.finished))
        return result

    def _checkpoint(self, plan: Plan) -> None:
        leaving = set()
        for p in plan.preempted:
            rid = p.request_id
            if p.checkpoint is Checkpoint.PARK:
                self.parks += 1
            else:
                self.recomputes += 1
            if rid in self.batch:
                if p.checkpoint is Checkpoint.PARK:
                    self._parked[rid] = _Parked(self._to_host(self.batch.extract(rid)), True)
                leaving.add(rid)
            elif rid in self._prefilling:
                partial = self._prefilling.pop(rid)
                if p.checkpoint is Checkpoint.PARK:
                    kv = ParkedKV(layers_of(partial.cache), partial.computed)
                    self._parked[rid] = _Parked(self._to_host(kv), False)
            elif p.checkpoint is Checkpoint.PARK:
                raise RunnerError(f"cannot park {rid!r}: it holds no KV")
        self.batch.remove(leaving)

    def _to_host(self, kv: ParkedKV) -> ParkedKV:
        """A copy in host memory (pinned when the device is a GPU, so restoring is fast)."""
        pin = self.device.type == "cuda"

        def copy(t: torch.Tensor) -> torch.Tensor:
            t = t.to(self.host, copy=True)
            return t.pin_memory() if pin else t

        return ParkedKV([(copy(k), copy(v)) for k, v in kv.layers], kv.length)

    def _restore(self, resumed: tuple[RequestId, ...]) -> None:
        joining = []
        for rid in resumed:
            parked = self._parked.pop(rid, None)
            if parked is None:
                raise RunnerError(f"cannot resume {rid!r}: nothing is parked for it")
            if parked.in_batch:
                joining.append(RowGroup([rid], parked.kv.layers, [parked.kv.length]))
            else:
                layers = [(k.to(self.device), v.to(self.device)) for k, v in parked.kv.layers]
                self._prefilling[rid] = _Prefilling(cache_from_layers(layers), parked.kv.length)
        self.batch.add(joining)

    def _decode(self, decode: tuple[RequestId, ...], result: RunResult) -> None:
        if set(decode) != set(self.batch.rows):
            raise RunnerError(f"plan decodes {sorted(decode)} but the batch holds {sorted(self.batch.rows)}")
        rows = [self._requests[rid] for rid in self.batch.rows]
        input_ids = torch.tensor([[r.last] for r in rows], device=self.device)
        mask, positions = self.batch.decode_inputs()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=self.batch.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.batch.advanced()
        self._emit(rows, out.logits[:, -1, :], result)

    def _prefill(self, chunks: tuple[PrefillChunk, ...], result: RunResult) -> list[RowGroup]:
        """Run the step's prefill chunks; return the rows whose prefill completed.

        Fresh prompts are prefilled together in one left-padded forward (one
        call instead of one per request); a chunk that continues an earlier
        one extends that request's own cache.
        """
        for chunk in chunks:
            r = self._requests[chunk.request_id]
            computed = self._prefilling[r.id].computed if r.id in self._prefilling else 0
            if chunk.start != computed:
                raise RunnerError(
                    f"prefill chunk of {r.id!r} starts at {chunk.start}, but {computed} tokens are computed"
                )
            if chunk.start + chunk.tokens > r.context:
                raise RunnerError(f"prefill chunk of {r.id!r} runs past its context ({r.context})")
            if chunk.produces_token and chunk.start + chunk.tokens != r.context:
                raise RunnerError(f"prefill of {r.id!r} yields a token before its context is computed")
        fresh = [c for c in chunks if c.start == 0]
        joining = [self._prefill_fresh(fresh, result)] if fresh else []
        for chunk in chunks:
            if chunk.start > 0:
                joining.append(self._prefill_continued(chunk, result))
        return joining

    def _prefill_fresh(self, chunks: list[PrefillChunk], result: RunResult) -> RowGroup:
        requests = [self._requests[c.request_id] for c in chunks]
        lengths = [c.tokens for c in chunks]
        width = max(lengths)
        pad = self.loaded.tokenizer.pad_token_id or 0
        input_ids = torch.tensor(
            [[pad] * (width - n) + r.tokens(0, n) for r, n in zip(requests, lengths, strict=True)],
            device=self.device,
        )
        columns = torch.arange(width, device=self.device).unsqueeze(0)
        starts = torch.tensor([width - n for n in lengths], device=self.device).unsqueeze(1)
        mask = (columns >= starts).long()
        positions = (columns - starts).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        layers = layers_of(cache)
        done = [i for i, c in enumerate(chunks) if c.produces_token]
        for i, c in enumerate(chunks):
            if not c.produces_token:  # a long prompt's first chunk: it keeps its own cache
                own = [
                    (k[i : i + 1, :, width - c.tokens :, :], v[i : i + 1, :, width - c.tokens :, :])
                    for k, v in layers
                ]
                self._prefilling[c.request_id] = _Prefilling(cache_from_layers(own), c.tokens)
        if not done:
            return RowGroup([], [], [])
        self._emit([requests[i] for i in done], out.logits[done, -1, :], result)
        index = torch.tensor(done, device=self.device)
        return RowGroup(
            [chunks[i].request_id for i in done],
            [(k.index_select(0, index), v.index_select(0, index)) for k, v in layers],
            [lengths[i] for i in done],
        )

    def _prefill_continued(self, chunk: PrefillChunk, result: RunResult) -> RowGroup:
        r = self._requests[chunk.request_id]
        cache = self._prefilling.pop(r.id).cache
        end = chunk.start + chunk.tokens
        input_ids = torch.tensor([r.tokens(chunk.start, end)], device=self.device)
        positions = torch.arange(chunk.start, end, device=self.device).unsqueeze(0)
        out = self.model(
            input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
        if not chunk.produces_token:
            self._prefilling[r.id] = _Prefilling(cache, end)
            return RowGroup([], [], [])
        self._emit([r], out.logits[:, -1, :], result)
        return RowGroup([r.id], layers_of(cache), [end])

    def _emit(self, rows: list[_ModelRequest], logits: torch.Tensor, result: RunResult) -> None:
        end_ids = tuple(sorted(self.loaded.eos_token_ids))
        samples = [r.row(logits.device, end_ids + r.params.stop_token_ids) for r in rows]
        allowed = None
        if any(r.grammar is not None for r in rows):
            allowed = self.grammars.allowed([r.grammar for r in rows], logits.device)
            if allowed.shape[-1] < logits.shape[-1]:  # logits wider than the tokenizer: never those
                allowed = torch.nn.functional.pad(allowed, (0, logits.shape[-1] - allowed.shape[-1]))
        choice = choose_tokens(logits, samples, allowed)
        for r, token, logprobs in zip(rows, choice.tokens, choice.logprobs, strict=True):
            if r.grammar is not None and r.grammar.is_error():  # its mask could not be computed
                result.failed[r.id] = grammar_failure(r.grammar)
                continue
            request = r.request
            request.output.append(token)
            result.tokens[r.id] = token
            if logprobs is not None:
                request.output_logprobs.append(self._record(token, *logprobs))
            if r.grammar is not None and not r.grammar.consume_token(token):
                result.failed[r.id] = grammar_failure(r.grammar)
                continue
            check = self._stop(r, token)
            if check.finished is not None:
                request.stop = result.finished[r.id] = check

    def _stop(self, r: _ModelRequest, token: int) -> StopCheck:
        """Whether `r` is done after `token` (which its grammar took); a grammar that is complete ends it
        as EOS does."""
        if r.grammar is not None and r.grammar.is_stopped():  # before min_tokens too: nothing may follow
            return StopCheck(RequestStatus.FINISHED_STOPPED, on_token=token in self.loaded.eos_token_ids)
        output = r.request.output
        if r.text is not None:
            r.text.extend(output)
        return check_stop(token, len(output), r.params.max_tokens, r.context, self.loaded.context_length,
                          self.loaded.eos_token_ids, r.text, rules=r.rules)

    def _record(self, token: int, logprob: float, top_ids: list[int], top_logprobs: list[float]
                ) -> TokenLogprobs:
        return TokenLogprobs(Logprob(token, logprob, self._piece(token)),
                             tuple(Logprob(t, lp, self._piece(t)) for t, lp in zip(top_ids, top_logprobs,
                                                                                  strict=True)))

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.loaded.tokenizer.decode([token], skip_special_tokens=False)
        return piece


__all__ = ["ModelRunner", "RunnerError"]
