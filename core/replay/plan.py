"""What a replay sends and when: a trace's requests as timed OpenAI request bodies (pure).

Each request of the trace (read, assigned and scaled by `load_trace`, as
`fsched simulate` reads it, so both see the same requests) becomes one
streamed chat or completions request, sent at its arrival time from its
tenant's key: its class as `service_tier` (OpenAI's names, as fsched maps
them), `max_tokens` its output length, forced to that length where the
endpoint takes `ignore_eos` and `min_tokens`, and a prompt of its prompt
length in the served model's tokens.

A prompt is words drawn from a short list of common English words, each one
token in the usual tokenizers (a space before each), in an order of its own
per request: no two prompts share a prefix, so an engine's prefix cache
saves nothing a real workload's would not.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from fsched.core.openai.online import DEFAULT_PRIORITY, TIER_OF_CLASS
from fsched.core.sim.trace import TraceRequest

WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "was", "he", "be",
         "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which")


@dataclass(slots=True, frozen=True)
class Send:
    """One request of the trace and when it goes out (seconds after the replay starts)."""

    index: int  # its place in the trace (arrival order)
    at_s: float
    request: TraceRequest


def send_plan(trace: Sequence[TraceRequest], duration_s: float | None = None) -> list[Send]:
    """The trace's requests in arrival order, from the first arrival; with `duration_s`, only those
    arriving within that many seconds of it."""
    if duration_s is not None and not duration_s > 0:
        raise ValueError("the duration must be > 0 seconds")
    ordered = sorted(trace, key=lambda r: r.arrival_s)
    t0 = ordered[0].arrival_s if ordered else 0.0
    sends = [Send(i, r.arrival_s - t0, r) for i, r in enumerate(ordered)]
    return sends if duration_s is None else [s for s in sends if s.at_s < duration_s]


@dataclass(slots=True, frozen=True)
class PromptShape:
    """How many words make a prompt of N tokens: tokens = overhead + per_word x words.

    `measured` is whether the endpoint's /tokenize counted it; otherwise it is
    the approximation one token a word, nothing around it.
    """

    per_word: float = 1.0
    overhead: int = 0
    measured: bool = False

    def __post_init__(self) -> None:
        if not self.per_word > 0:
            raise ValueError("per_word must be > 0")

    @classmethod
    def from_counts(cls, short: tuple[int, int], long: tuple[int, int]) -> PromptShape:
        """The shape from two (words, tokens) counts of prompts of different lengths."""
        (w1, t1), (w2, t2) = short, long
        if w2 <= w1 or t2 <= t1:
            raise ValueError(f"token counts do not grow with the prompt: {short} then {long}")
        per_word = (t2 - t1) / (w2 - w1)
        return cls(per_word, max(0, round(t1 - per_word * w1)), measured=True)

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))

    def describe(self) -> str:
        if not self.measured:
            return "approximate: one token a word (the endpoint has no /tokenize)"
        unit = "token" if self.per_word == 1 else "tokens"
        return f"counted by the endpoint's /tokenize: {self.per_word:g} {unit} a word, {self.overhead} more"


def prompt_text(words: int, seed: int) -> str:
    """`words` of WORDS in an order drawn from `seed` (the same seed, the same prompt)."""
    return " ".join(random.Random(seed).choices(WORDS, k=words))


@dataclass(slots=True, frozen=True)
class Forcing:
    """The length-forcing fields the endpoint takes (vLLM's and fsched's both do)."""

    ignore_eos: bool = True
    min_tokens: bool = True

    def describe(self) -> str:
        if self.ignore_eos or self.min_tokens:
            fields = [f for f, on in (("ignore_eos", self.ignore_eos), ("min_tokens", self.min_tokens)) if on]
            return "forced to the trace's length (" + ", ".join(fields) + ")"
        return "not forced: the endpoint refused ignore_eos and min_tokens; outputs may end early"


def request_body(send: Send, *, model: str, chat: bool, prompt: str, forcing: Forcing) -> dict:
    """The streamed request `send` makes: greedy, its usage in the last chunk."""
    req = send.request
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                  "max_tokens": req.output_tokens, "temperature": 0,
                  "service_tier": TIER_OF_CLASS[req.request_class]}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if forcing.ignore_eos:
        body["ignore_eos"] = True
    if forcing.min_tokens:
        body["min_tokens"] = req.output_tokens
    if req.priority != DEFAULT_PRIORITY:  # a trace's own priority; fsched's neutral value is left out
        body["priority"] = req.priority
    return body
