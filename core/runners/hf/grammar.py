"""Grammar masks on tensors: one matcher per structured request, the batch's masks in one call.

A request's grammar state is a function of its generated tokens alone: a matcher is copied from its
grammar's compiled template and fed the tokens generated so far (a resume after a restart, or a
recompute, rebuilds exactly the state an uninterrupted run has), then one token at a time.

Compiling a grammar into a matcher takes up to seconds for a large schema (1.6 s for 5,000 required
properties on the tiny model's tokenizer); copying a compiled one takes microseconds. So the engine
asks `prepare` first: a grammar not yet compiled is compiled on a thread of its own (llguidance drops
the GIL meanwhile) while the step loop goes on, and each choice's matcher is a copy of the template.
That thread's stack is larger than the isolated worker's (core/grammar/pool.py): what compiled there
cannot overflow here.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import llguidance
import llguidance.hf
import torch

from fsched.core.grammar import GrammarError, GrammarLimits, GrammarSource
from fsched.core.grammar.cache import VerdictCache
from fsched.core.grammar.llg import grammar_text

_SHIFTS = torch.arange(32, dtype=torch.int32)
COMPILE_STACK_BYTES = 64 << 20  # eight times the isolated worker's stack
TEMPLATES = 64  # compiled grammars kept, the least recently used dropped first
COMPILE_NICENESS = 10  # below the step loop: on a busy CPU a compile waits, the other tenants' steps do not


class CompileThread:
    """One thread, with a large stack, that runs the compiles handed to it in turn."""

    def __init__(self, stack_bytes: int = COMPILE_STACK_BYTES):
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        before = threading.stack_size(stack_bytes)
        try:
            threading.Thread(target=self._serve, name="grammar-compile", daemon=True).start()
        finally:
            threading.stack_size(before)

    def submit(self, fn: Callable[[], object]) -> Future:
        done: Future = Future()
        self._jobs.put((fn, done))
        return done

    def _serve(self) -> None:
        try:  # on Linux a thread has a priority of its own: the step loop comes first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
        except OSError:
            pass
        while True:
            fn, done = self._jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
                done.set_exception(exc)


class Grammars:
    """What a model's structured requests share: the tokenizer as llguidance sees it, the compiled
    templates by content, the compile thread, the executor."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int],
                 limits: GrammarLimits = GrammarLimits()):
        self.vocab_size = vocab_size
        self.limits = limits
        self._tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._templates: VerdictCache[llguidance.LLMatcher] = VerdictCache(TEMPLATES)
        self._compiling: dict[str, Future] = {}
        self._thread: CompileThread | None = None

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        if self._lltokenizer is None:  # built on first use: a model without structured requests pays nothing
            self._lltokenizer = llguidance.hf.from_tokenizer(self._tokenizer, n_vocab=self.vocab_size,
                                                             eos_token=self._eos)
        return self._lltokenizer

    def prepare(self, source: GrammarSource) -> Future | None:
        """None when the grammar is compiled; else the future of its compile, on the compile thread (one
        compile per distinct grammar, however many requests wait on it)."""
        key = source.key
        if self._templates.get(key) is not None:
            return None
        running = self._compiling.get(key)
        if running is None:
            tokenizer = self.lltokenizer
            if self._thread is None:
                self._thread = CompileThread()
            running = self._compiling[key] = self._thread.submit(lambda: self._compile(source, tokenizer))
            running.add_done_callback(lambda _: self._compiling.pop(key, None))
        return running

    def matcher(self, source: GrammarSource, generated: Sequence[int]) -> llguidance.LLMatcher:
        """A matcher in the state after `generated`; GrammarError when the tokens break the grammar."""
        template = self._templates.get(source.key) or self._compile(source, self.lltokenizer)
        m = template.deep_copy()
        if generated and not m.consume_tokens(list(generated)):
            raise GrammarError(f"the output so far does not follow the grammar: {m.get_error()}")
        return m

    def _compile(self, source: GrammarSource, tokenizer: llguidance.LLTokenizer) -> llguidance.LLMatcher:
        self.limits.check(source)
        template = llguidance.LLMatcher(tokenizer, grammar_text(source), log_level=0)
        if template.is_error():
            raise GrammarError(f"the {source.kind.label} cannot be used: {template.get_error()}")
        self._templates.put(source.key, template)
        return template

    def allowed(self, matchers: Sequence[llguidance.LLMatcher | None], device: torch.device) -> torch.Tensor:
        """[rows, vocab] bool: the tokens each row's grammar allows next (every token for a row without)."""
        words = (self.vocab_size + 31) // 32
        bitmask = torch.full((len(matchers), words), -1, dtype=torch.int32)
        constrained = [(m, i) for i, m in enumerate(matchers) if m is not None]
        if constrained:
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            self._executor.unsafe_compute_mask_ptr(constrained, bitmask.data_ptr(), words * 4, len(matchers))
        bits = (bitmask.unsqueeze(-1) >> _SHIFTS) & 1
        return bits.reshape(len(matchers), words * 32)[:, : self.vocab_size].bool().to(device)


__all__ = ["GrammarError", "Grammars"]
