"""What a structured request costs the daemon's step loop, on the built-in tiny model.

Times, for one schema of PROPERTIES required integer properties: its compile in the isolated worker
(serve's check), the compile into a matcher on the runner's compile thread (off the step loop), adding
N choices once it is compiled (each a copy of the compiled matcher: what the step loop pays), and the
steps that follow (the masks of N constrained rows and one free row).

    nice .venv/bin/python bench/grammar_bound.py [PROPERTIES] [N]
"""

from __future__ import annotations

import statistics
import sys
import time

from fsched.core.grammar import GrammarSource
from fsched.core.grammar.pool import WorkerPool
from fsched.core.runners.hf.model import load_model
from fsched.core.runners.hf.runner import ModelRunner
from fsched.core.sched.plan import Plan, PrefillChunk
from fsched.core.sched.request import Request
from fsched.core.types import ResponseFormat, SamplingParams


def main(properties: int = 5_000, n: int = 16) -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(properties)},
              "required": [f"p{i}" for i in range(properties)], "additionalProperties": False}
    fmt = ResponseFormat.json_schema(schema)
    pool = WorkerPool()
    start = time.perf_counter()
    pool.compile(GrammarSource.of(fmt))
    print(f"isolated worker compile (with the worker's start): {time.perf_counter() - start:.2f} s")
    pool.close()
    runner = ModelRunner(load_model(None, device="cpu"))
    params = SamplingParams(max_tokens=32, seed=1, response_format=fmt)
    start = time.perf_counter()
    runner.prepare(params).result()
    print(f"matcher compile on the compile thread: {time.perf_counter() - start:.2f} s")
    prompt = runner.encode("hello")
    adds = []
    for i in range(n):
        t = time.perf_counter()
        runner.add(Request.to_run(f"r{i}", prompt, params))
        adds.append(time.perf_counter() - t)
    runner.add(Request.to_run("free", prompt, SamplingParams(max_tokens=32, seed=2, ignore_eos=True)))
    print(f"add, per choice: median {statistics.median(adds) * 1e6:.0f} us, max {max(adds) * 1e6:.0f} us")
    ids = [*(f"r{i}" for i in range(n)), "free"]
    chunks = tuple(PrefillChunk(rid, 0, len(prompt), True) for rid in ids)
    steps = [_timed(runner, Plan(0, prefill=chunks))]
    steps += [_timed(runner, Plan(i + 1, decode=tuple(ids))) for i in range(8)]
    print("steps (ms): " + " ".join(f"{s * 1e3:.0f}" for s in steps))
    print(f"masks alone, {n} rows: " + ", ".join(f"{_masks(runner, ids[:n]) * 1e3:.1f} ms" for _ in range(3)))


def _timed(runner: ModelRunner, plan: Plan) -> float:
    t = time.perf_counter()
    runner.run(plan)
    return time.perf_counter() - t


def _masks(runner: ModelRunner, ids: list[str]) -> float:
    matchers = [runner._requests[rid].grammar for rid in ids]
    t = time.perf_counter()
    runner.grammars.allowed(matchers, runner.device)
    return time.perf_counter() - t


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
