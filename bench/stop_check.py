"""What checking stop strings costs per token, with the built-in model's tokenizer (no model run).

    .venv/bin/python bench/stop_check.py [--tokens 100,500,2000] [--requests 8]

For outputs of each length (random token ids), the CPU time to check two stop
strings that never match after every token: decoding the whole output each
time (how it was done) against `StopText` (the new text and a window).
"""

from __future__ import annotations

import argparse
import random
import time

from fsched.core.runners.stopping import StopText, first_stop

STOPS = ("\x1fnever\x1f", "@@@@ stop @@@@")


def whole(decode, tokens: list[int]) -> None:
    for n in range(1, len(tokens) + 1):
        first_stop(decode(tokens[:n]), STOPS, False)


def windowed(decode, tokens: list[int]) -> None:
    text, grown = StopText(STOPS, decode), []
    for token in tokens:  # the runner passes its own list, grown a token at a time
        grown.append(token)
        text.extend(grown)
        text.first_stop(False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="100,500,2000")
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()
    from fsched.core.runners.hf.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None).tokenizer

    def decode(ids) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    rng = random.Random(0)
    print(f"{'tokens':>7} {'whole us/token':>15} {'window us/token':>16}")
    for length in map(int, args.tokens.split(",")):
        outputs = [[rng.randrange(3, len(tokenizer)) for _ in range(length)] for _ in range(args.requests)]
        cost = []
        for check in (whole, windowed):
            start = time.process_time()
            for tokens in outputs:
                check(decode, tokens)
            cost.append((time.process_time() - start) / (length * args.requests) * 1e6)
        print(f"{length:7} {cost[0]:15.1f} {cost[1]:16.1f}")


if __name__ == "__main__":
    main()
