"""Grammar masks on tensors: one matcher per structured request, the batch's masks in one call.

A request's grammar state is a function of its generated tokens alone: a
matcher is built from the grammar and fed the tokens generated so far (a
resume after a restart, or a recompute, rebuilds exactly the state an
uninterrupted run has), then one token at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.hf
import torch

from fsched.core.jobs.grammar import GrammarError, grammar_of
from fsched.core.types import ResponseFormat

_SHIFTS = torch.arange(32, dtype=torch.int32)


class Grammars:
    """What a model's structured requests share: the tokenizer as llguidance sees it, the executor."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        if self._lltokenizer is None:  # built on first use: a model without structured requests pays nothing
            self._lltokenizer = llguidance.hf.from_tokenizer(self._tokenizer, n_vocab=self.vocab_size,
                                                             eos_token=self._eos)
        return self._lltokenizer

    def matcher(self, response_format: ResponseFormat, generated: Sequence[int]) -> llguidance.LLMatcher:
        """A matcher in the state after `generated`; GrammarError when the tokens break the grammar."""
        m = llguidance.LLMatcher(self.lltokenizer, grammar_of(response_format), log_level=0)
        if m.is_error():
            raise GrammarError(f"the JSON schema cannot be used: {m.get_error()}")
        if generated and not m.consume_tokens(list(generated)):
            raise GrammarError(f"the output so far does not follow the grammar: {m.get_error()}")
        return m

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
