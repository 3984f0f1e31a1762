"""Fit the simulator's cost model to the real engine's measured step times.

    .venv/bin/python bench/calibrate.py [--device cpu] [--threads 2]

Runs the engine (scheduler + runner, tiny default model) over workloads that
vary the batch size, the prompt lengths and the KV held, with preemptions
that park KV, records every step's (tokens processed, KV held, KV swapped,
seconds), and fits

    step_s = base_s + token_s * tokens + kv_token_s * kv_held + swap_token_s * swapped

by least squares with non-negative constants. Prints the constants (paste
them into `core/sim/costmodel.py` PROFILES), R² and the error of the fit, beside
a baseline: the error of the best constant-per-step model (base_s alone).
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch


def collect(loaded, seed: int) -> list[tuple[int, int, int, float]]:
    from fsched.core.daemon.engine import Engine
    from fsched.core.runners.hf.runner import ModelRunner
    from fsched.core.sched.config import SchedulerConfig
    from fsched.core.sched.request import Request
    from fsched.core.sched.scheduler import Scheduler
    from fsched.core.types import RequestClass, SamplingParams

    rng = random.Random(seed)
    vocab = len(loaded.tokenizer)
    samples: list[tuple[int, int, int, float]] = []
    for max_batch, prompt_hi, out_hi in [
        (1, 64, 32),
        (4, 256, 64),
        (8, 512, 64),
        (16, 128, 96),
        (32, 256, 128),
        (64, 128, 64),
    ]:
        config = SchedulerConfig(
            max_batch=max_batch,
            kv_tokens=65_536,
            step_tokens=512,
            min_quantum_steps=2,
            host_kv_tokens=100_000,
        )
        runner = ModelRunner(loaded)
        engine = Engine(runner, Scheduler(config, "priority"), loaded.context_length)
        original = runner.run

        def recording(plan, original=original):
            result = original(plan)
            samples.append((plan.tokens, plan.kv_tokens, plan.swap_tokens, result.outcome.elapsed_s))
            return result

        runner.run = recording
        batch, realtime = [], []
        for i in range(3 * max_batch + 4):
            request = Request.to_run(
                f"r{i}",
                [rng.randrange(3, vocab) for _ in range(rng.randint(8, prompt_hi))],
                SamplingParams(max_tokens=rng.randint(4, out_hi), temperature=0),
            )
            if i % 5 == 4:  # realtime arrivals mid-run preempt batch work: parks and restores
                request.request_class = RequestClass.REALTIME
                realtime.append(request)
            else:
                batch.append(request)
        for request in batch:
            engine.add(request)
        step = 0
        while engine.has_work or realtime:
            if realtime and step % 7 == 3:
                engine.add(realtime.pop())
            engine.step()
            step += 1
    return samples


def fit(samples, columns: list[int]) -> list[float]:
    """Least squares of the *relative* error on the chosen columns (0 tokens, 1 kv, 2 swap)
    plus an intercept: a 5 ms step mispredicted by 5 ms weighs as much as a 500 ms one
    mispredicted by 500 ms, so long prefills do not drown the many short decode steps."""
    x = torch.tensor([[1.0] + [float(s[c]) for c in columns] for s in samples], dtype=torch.float64)
    y = torch.tensor([s[3] for s in samples], dtype=torch.float64)
    w = 1.0 / y
    return torch.linalg.lstsq(x * w.unsqueeze(1), (y * w).unsqueeze(1)).solution.squeeze(1).tolist()


def nonnegative_fit(samples) -> dict[str, float]:
    names = ["token_s", "kv_token_s", "swap_token_s"]
    columns = [0, 1, 2]
    while True:
        coef = fit(samples, columns)
        negative = [i for i, c in enumerate(coef[1:]) if c < 0]
        if not negative:
            break
        del columns[negative[0]]  # a constant the data cannot support is 0
    result = {"base_s": max(coef[0], 0.0), **{n: 0.0 for n in names}}
    for c, value in zip(columns, coef[1:], strict=True):
        result[names[c]] = value
    return result


def predict(model: dict[str, float], s) -> float:
    return (
        model["base_s"] + model["token_s"] * s[0] + model["kv_token_s"] * s[1] + model["swap_token_s"] * s[2]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from fsched.core.runners.hf.model import load_model

    loaded = load_model(None, device=args.device)
    with torch.inference_mode():
        collect(loaded, args.seed + 1)  # warm-up
        samples = collect(loaded, args.seed)
    # Drop the slowest 1% relative to their size (allocator growth, the odd scheduler hiccup of the OS).
    samples.sort(key=lambda s: s[3] / (1 + s[0]))
    samples = samples[: int(len(samples) * 0.99)]
    model = nonnegative_fit(samples)
    actual = [s[3] for s in samples]
    mean = statistics.fmean(actual)
    ss_tot = sum((a - mean) ** 2 for a in actual)
    ss_res = sum((a - predict(model, s)) ** 2 for s, a in zip(samples, actual, strict=True))
    mape = statistics.fmean(abs(predict(model, s) - a) / a for s, a in zip(samples, actual, strict=True))
    base_only = statistics.fmean(abs(mean - a) / a for a in actual)
    print(
        f"{len(samples)} steps measured on {loaded.describe()}, {torch.get_num_threads()} threads; "
        f"tokens/step {min(s[0] for s in samples)}-{max(s[0] for s in samples)}, "
        f"KV held up to {max(s[1] for s in samples)}, swaps in {sum(1 for s in samples if s[2])} steps"
    )
    print("fitted cost model:")
    for name, value in model.items():
        print(f"  {name:13} = {value:.3e}")
    print(
        f"R^2 {1 - ss_res / ss_tot:.3f}; mean abs error {mape:.1%} of a step "
        f"(baseline, one constant per step: {base_only:.1%})"
    )
    print("CostModel(" + ", ".join(f"{k}={v:.3e}" for k, v in model.items()) + ")")


if __name__ == "__main__":
    main()
