"""Benchmark: what each sampling field costs the built-in engine, and the grammar's mask per token.

    .venv/bin/python bench/sampling.py                       # the tiny model, 2 threads, every mode
    .venv/bin/python bench/sampling.py --modes greedy,sampled --seeds 0,1

The workload of bench/engine.py (64 requests, prompts 16-128 tokens, outputs
8-128, max batch 32) through fsched's engine, once per mode:
  greedy     temperature 0 (the fast path: a bare argmax)
  sampled    temperature 0.8, top_p 0.9, top_k 50
  penalties  sampled, plus presence 0.5, frequency 0.5, repetition 1.1
  bias+minp  sampled, plus 8 logit_bias entries, min_p 0.05, min_tokens 4
  logprobs   sampled, plus logprobs with 5 top alternatives
  stop       sampled, plus two stop strings that never match (every output runs to its length)
  json       sampled, under a JSON schema (structured output)
Prints tok/s per mode and the ratio to greedy; for json also the grammar's
share: mask computation per token (llguidance) and the mask applied.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 24},
    "score": {"type": "integer", "minimum": 0, "maximum": 100},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["title", "score", "tags", "ok"], "additionalProperties": False}


def mode_fields(mode: str, vocab: int, rng: random.Random) -> dict:
    from fsched.core.types import ResponseFormat, SamplingParams

    sampled = {"temperature": 0.8, "top_p": 0.9, "top_k": 50}
    if mode == "greedy":
        return {"temperature": 0.0}
    if mode == "sampled":
        return sampled
    if mode == "penalties":
        return {**sampled, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1}
    if mode == "bias+minp":  # its own random draws: the other modes' workloads stay the same
        bias = {rng.randrange(vocab): rng.uniform(-20, 20) for _ in range(8)}
        return {**sampled, "min_p": 0.05, "min_tokens": 4, "logit_bias": SamplingParams.logit_bias_of(bias)}
    if mode == "logprobs":
        return {**sampled, "logprobs": 5}
    if mode == "stop":
        return {**sampled, "stop": ("\x1fnever\x1f", "@@@@ stop @@@@")}
    return {**sampled, "response_format": ResponseFormat.json_schema(SCHEMA)}


def run(loaded, mode: str, seed: int, n: int) -> tuple[int, float, int]:
    from fsched.core.daemon.engine import Engine
    from fsched.core.runners.hf.runner import ModelRunner
    from fsched.core.sched.config import SchedulerConfig
    from fsched.core.sched.request import Request
    from fsched.core.sched.scheduler import Scheduler
    from fsched.core.types import SamplingParams

    rng = random.Random(seed)
    vocab = len(loaded.tokenizer)
    requests = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(16, 128))]
        params = SamplingParams(max_tokens=rng.randint(8, 128), seed=seed * 1000 + i,
                                **mode_fields(mode, vocab, random.Random(i)))
        requests.append(Request.to_run(f"r{i}", prompt, params))
    config = SchedulerConfig(max_batch=32, kv_tokens=65_536, step_tokens=2048)
    engine = Engine(ModelRunner(loaded), Scheduler(config, "fsched"), loaded.context_length)
    start = time.perf_counter()
    results = engine.run_all(requests)
    elapsed = time.perf_counter() - start
    return sum(len(r.tokens) for r in results.values()), elapsed, engine.steps


def mask_cost(loaded, rows: int = 32, steps: int = 200) -> tuple[float, float]:
    """Seconds per token to compute a batch's grammar masks, and to apply them to the logits."""
    from fsched.core.runners.hf.grammar import Grammars
    from fsched.core.types import ResponseFormat

    vocab = int(loaded.model.config.vocab_size)
    grammars = Grammars(loaded.tokenizer, vocab, sorted(loaded.eos_token_ids))
    fmt = ResponseFormat.json_schema(SCHEMA)
    matchers = [grammars.matcher(fmt, ()) for _ in range(rows)]
    rng = random.Random(0)
    logits = torch.randn(rows, vocab)
    compute = apply = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        allowed = grammars.allowed(matchers, logits.device)
        t1 = time.perf_counter()
        logits.clone().masked_fill_(~allowed, float("-inf"))
        apply += time.perf_counter() - t1
        compute += t1 - t0
        for i, m in enumerate(matchers):
            ok = allowed[i].nonzero().flatten().tolist()
            m.consume_token(rng.choice(ok))
            if m.is_stopped():
                matchers[i] = grammars.matcher(fmt, ())
    return compute / (rows * steps), apply / (rows * steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--modes", default="greedy,sampled,penalties,bias+minp,logprobs,stop,json")
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from fsched.core.runners.hf.model import load_model

    loaded = load_model(None)
    print(f"model: {loaded.describe()}; threads {torch.get_num_threads()}", flush=True)
    with torch.inference_mode():
        run(loaded, "greedy", 99, 8)  # warm-up
        base = None
        print(f"{'mode':10} {'seed':>4} {'tokens':>7} {'steps':>6} {'seconds':>8} {'tok/s':>8} "
              f"{'vs greedy':>9}")
        for mode in args.modes.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                tokens, seconds, steps = run(loaded, mode, seed, args.requests)
                rate = tokens / seconds
                base = rate if mode == "greedy" and base is None else base
                ratio = f"{rate / base:8.2f}x" if base else ""
                print(f"{mode:10} {seed:4} {tokens:7} {steps:6} {seconds:8.2f} {rate:8.1f} {ratio:>9}",
                      flush=True)
        if "json" in args.modes:
            compute, apply = mask_cost(loaded)
            print(f"\ngrammar mask (llguidance), batch of 32, vocab {loaded.model.config.vocab_size}: "
                  f"{compute * 1e6:.1f} us per token to compute, {apply * 1e6:.1f} us to apply")


if __name__ == "__main__":
    main()
