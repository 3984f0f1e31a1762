"""What a daemon in front of a remote engine spends detokenizing a streamed token: the incremental
detokenizer (core/runners/detokenize.py) over a request's output, one token a step, three ways: its
window decoding through transformers' `decode`, its window decoding through the tokenizer's own
backend, and the backend's incremental decoder (`TokenizerOnly.decode`, what the daemon does); then
the same for a request's stop strings (core/runners/stopping.py's StopText, which reads the settled text
to look for them), and a request's whole output in one call (a batch request's text when it ends), the
window's way through the backend against the backend's incremental decoder.

    .venv/bin/python bench/detokenize_path.py [--model tiny] [--tokens 64] [--rounds 7]

The output is the model's encoding of the shipped corpus, cut
into requests of `--tokens` tokens (a fresh detokenizer each); each round
times every way, in turn, in process CPU time; the median and the best
of `--rounds` are printed, so other processes' load counts little. All
ways must give the same texts, token by token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsched.core.runners.detokenize import Detokenizer  # noqa: E402
from fsched.core.runners.hf.tokenizer import load_tokenizer  # noqa: E402
from fsched.core.runners.stopping import StopText  # noqa: E402


def texts(decode, requests: list[list[int]]) -> tuple[float, list[str]]:
    """Process CPU seconds to stream every request, one token a step, and each step's text."""
    out = []
    start = time.process_time()
    for ids in requests:
        shown, tokens = Detokenizer(decode), []
        for token in ids:
            tokens.append(token)
            out.append(shown.text(tokens))
    return time.process_time() - start, out


def stop_texts(decode, requests: list[list[int]]) -> tuple[float, list[str]]:
    """Process CPU seconds to read every request's text for a stop string (one that never comes), one
    token a step, and each request's settled text at its end."""
    out = []
    start = time.process_time()
    for ids in requests:
        read, tokens = StopText(("\n\n\n\n",), decode), []
        for token in ids:
            tokens.append(token)
            read.extend(tokens)
        out.append(read.text)
    return time.process_time() - start, out


def whole_texts(decode, requests: list[list[int]]) -> tuple[float, list[str]]:
    """Process CPU seconds to make every request's text from its whole output in one call (a batch
    request's text when it ends), and the texts."""
    start = time.process_time()
    out = [Detokenizer(decode).text(ids) for ids in requests]
    return time.process_time() - start, out


def timed(ways: dict, measure, requests: list[list[int]], rounds: int) -> dict[str, list[float]]:
    """Each way's µs a token in every round (the ways in turn); every way must give the same texts."""
    n = sum(map(len, requests))
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        seen = []
        for name, decode in ways.items():
            spent, out = measure(decode, requests)
            times[name].append(1e6 * spent / n)
            seen.append(out)
        if any(out != seen[0] for out in seen[1:]):
            raise SystemExit("the ways gave different texts")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = load_tokenizer(args.model)
    corpus = resources.files("fsched.core").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    encode = partial(tok.tokenizer.encode, add_special_tokens=False)
    ids = [t for line in corpus.splitlines(keepends=True) for t in encode(line)]
    requests = [ids[i : i + args.tokens] for i in range(0, len(ids) - args.tokens, args.tokens)][:400]
    n = sum(map(len, requests))
    backend = partial(tok.tokenizer._tokenizer.decode, skip_special_tokens=True)
    stream = "the backend's stream (TokenizerOnly.decode)"
    shown = timed({"window, transformers decode": partial(tok.tokenizer.decode, skip_special_tokens=True),
                   "window, backend decode": backend, stream: tok.decode}, texts, requests, args.rounds)
    stops = timed({"window, backend decode": backend, stream: tok.decode}, stop_texts, requests, args.rounds)
    whole = timed({"window, backend decode": backend, stream: tok.decode}, whole_texts, requests, args.rounds)
    print(f"{len(requests)} requests of {args.tokens} tokens ({n:,} tokens), {args.rounds} rounds")
    for title, times in (("the text shown", shown), ("stop strings read", stops),
                         ("a whole output at once", whole)):
        print(f"{title}:")
        for name, got in times.items():
            print(f"  {name}: {statistics.median(got):.2f} µs/token median, {min(got):.2f} best")

if __name__ == "__main__":
    main()
