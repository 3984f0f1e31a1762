"""Benchmark: fsched's engine against Hugging Face generation, on one workload.

    .venv/bin/python bench/engine.py                     # CPU, the tiny default model, 2 threads
    .venv/bin/python bench/engine.py --device cuda --gpu-model   # a ~0.5B random Llama in bf16

Workload (the same for every method): 64 requests, prompts 16-128 tokens,
outputs 8-128 tokens, greedy. Methods:
  generate-1     `model.generate`, one request at a time (the baseline)
  static-B       `model.generate` on batches of B (8, 16, 32) in arrival order,
                 left padding; the best B is reported
  hf-cb          transformers' continuous batching (`init_continuous_batching`,
                 explicit num_blocks and max_batch_tokens)
  fsched         fsched's engine (scheduler + runner), max batch 32
Every method's outputs are checked against generate-1 (token-exact).
Tokens/s counts the requested output tokens (what a user receives).
Also reported: the cost of one preemption by parking the KV in host memory
versus dropping it and recomputing, in ms and in decode steps.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch


def workload(vocab: int, n: int, seed: int, prompt=(16, 128), output=(8, 128)):
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, vocab) for _ in range(rng.randint(*prompt))], rng.randint(*output))
        for _ in range(n)
    ]


def run_generate_one(loaded, work):
    outs = []
    for prompt, max_new in work:
        ids = torch.tensor([prompt], device=loaded.device)
        out = loaded.model.generate(
            ids, max_new_tokens=max_new, do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id
        )
        outs.append(out[0, len(prompt) :].tolist())
    return outs


def run_static(loaded, work, batch: int):
    pad = loaded.tokenizer.pad_token_id
    eos = loaded.eos_token_ids
    outs = []
    for start in range(0, len(work), batch):
        group = work[start : start + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in group], device=loaded.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group], device=loaded.device)
        out = loaded.model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max(m for _, m in group),
            do_sample=False,
            pad_token_id=pad,
        )
        for row, (_, max_new) in enumerate(group):
            tokens = out[row, width : width + max_new].tolist()
            cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            outs.append(tokens[:cut])
    return outs


def run_hf_cb(loaded, work, max_batch_tokens: int, num_blocks: int):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max(m for _, m in work),
        pad_token_id=loaded.tokenizer.pad_token_id,
        eos_token_id=sorted(loaded.eos_token_ids),
    )
    cb_config = ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)
    manager = loaded.model.init_continuous_batching(
        generation_config=config, continuous_batching_config=cb_config
    )
    manager.start()
    try:
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=m) for i, (p, m) in enumerate(work)]
        results = {}
        while len(results) < len(ids):
            out = manager.get_result(timeout=60)
            if out is None:
                raise RuntimeError("transformers' continuous batching returned nothing for 60 s")
            results[out.request_id] = list(out.generated_tokens)
    finally:
        manager.stop(block=True)
        destroy = getattr(loaded.model, "destroy_cached_continuous_batching_manager", None)
        if destroy:
            destroy()
    return [results[i] for i in ids]


def run_fsched(loaded, work, max_batch: int, kv_tokens: int, step_tokens: int):
    from fsched.core.daemon.engine import Engine
    from fsched.core.runners.hf.runner import ModelRunner
    from fsched.core.sched.config import SchedulerConfig
    from fsched.core.sched.request import Request
    from fsched.core.sched.scheduler import Scheduler
    from fsched.core.types import SamplingParams

    config = SchedulerConfig(max_batch=max_batch, kv_tokens=kv_tokens, step_tokens=step_tokens)
    engine = Engine(ModelRunner(loaded), Scheduler(config, "fsched"), loaded.context_length)
    requests = [
        Request.to_run(f"r{i}", p, SamplingParams(max_tokens=m, temperature=0))
        for i, (p, m) in enumerate(work)
    ]
    results = engine.run_all(requests)
    return [results[f"r{i}"].tokens for i in range(len(work))], engine.steps


def timed(fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start


def preemption_cost(loaded, contexts: int, batch: int, repeat: int = 5):
    """ms for one park+restore and one drop+recompute of a request with `contexts` tokens,
    beside the mean decode step of a batch of `batch` such requests."""
    from fsched.core.runners.hf.runner import ModelRunner
    from fsched.core.sched.plan import Plan, Preemption, PrefillChunk
    from fsched.core.sched.request import Checkpoint, Request
    from fsched.core.types import SamplingParams

    runner = ModelRunner(loaded)
    rng = random.Random(7)
    ids = [f"p{i}" for i in range(batch)]
    records = {rid: Request.to_run(rid, [rng.randrange(3, 1000) for _ in range(contexts)],
                                   SamplingParams(10_000, temperature=0)) for rid in ids}
    for record in records.values():
        runner.add(record)
    runner.run(Plan(step=0, prefill=tuple(PrefillChunk(r, 0, contexts, True) for r in ids)))
    decode = tuple(ids)
    steps = [runner.run(Plan(step=1, decode=decode)).outcome.elapsed_s for _ in range(repeat)]
    step_s = statistics.median(steps)
    victim = ids[0]
    park, recompute = [], []
    for _ in range(repeat):
        # Each checkpoint on its own plan, so the figures hold no decode step.
        out = runner.run(Plan(step=2, preempted=(Preemption(victim, Checkpoint.PARK, 0),)))
        back = runner.run(Plan(step=3, resumed=(victim,)))
        park.append(out.outcome.elapsed_s + back.outcome.elapsed_s)
        runner.run(Plan(step=4, decode=decode))
        drop = runner.run(Plan(step=5, preempted=(Preemption(victim, Checkpoint.RECOMPUTE, 0),)))
        context = len(records[victim].prompt) + len(records[victim].output)
        redo = runner.run(Plan(step=6, prefill=(PrefillChunk(victim, 0, context, True),)))
        recompute.append(drop.outcome.elapsed_s + redo.outcome.elapsed_s)
        runner.run(Plan(step=7, decode=decode))
    return step_s, statistics.median(park), statistics.median(recompute)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument(
        "--gpu-model",
        action="store_true",
        help="a ~0.5B random Llama in bf16 instead of the tiny model (for --device cuda)",
    )
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=2048,
        help="prefill budget of a step (the scheduler default; the CPU daemon uses 512)",
    )
    parser.add_argument("--static", default="8,16,32")
    parser.add_argument("--skip", default="", help="comma list of methods to skip")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from fsched.core.runners.hf.model import load_model

    loaded = load_gpu_model(args.device) if args.gpu_model else load_model(None, device=args.device)
    print(
        f"model: {loaded.describe()}, {loaded.num_parameters / 1e6:.1f}M parameters; "
        f"threads {torch.get_num_threads()}",
        flush=True,
    )
    work = workload(len(loaded.tokenizer), args.requests, args.seed)
    useful = sum(m for _, m in work)
    skip = set(args.skip.split(","))
    with torch.inference_mode():
        run_generate_one(loaded, work[:2])  # warm-up
        rows = []
        reference, base_s = timed(run_generate_one, loaded, work)
        produced = sum(len(t) for t in reference)
        rows.append(("generate-1", base_s, 0))
        print(
            f"workload: {len(work)} requests, {useful} requested output tokens, "
            f"{produced} produced (EOS ends some early)",
            flush=True,
        )
        if "static" not in skip:
            for b in (int(x) for x in args.static.split(",")):
                outs, s = timed(run_static, loaded, work, b)
                rows.append((f"static-{b}", s, _mismatches(outs, reference)))
        if "hf-cb" not in skip:
            tokens_needed = sum(len(p) + m for p, m in work)
            try:
                outs, s = timed(run_hf_cb, loaded, work, 256, max(64, tokens_needed // 32 + 64))
                rows.append(("hf-cb", s, _mismatches(outs, reference)))
            except Exception as exc:  # report, do not hide, a failure of the baseline
                print(f"hf-cb failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        (outs, steps), s = timed(run_fsched, loaded, work, args.max_batch, 65_536, args.step_tokens)
        rows.append((f"fsched (batch {args.max_batch}, {steps} steps)", s, _mismatches(outs, reference)))

    best_static = min((r for r in rows if r[0].startswith("static")), key=lambda r: r[1], default=None)
    cb = next((r for r in rows if r[0] == "hf-cb"), None)
    fs = rows[-1]
    print(f"\n{'method':34} {'seconds':>8} {'tok/s':>8} {'vs generate-1':>14} {'mismatches':>10}")
    for name, s, bad in rows:
        print(f"{name:34} {s:8.2f} {produced / s:8.1f} {base_s / s:13.2f}x {bad:>10}")
    if best_static:
        print(f"\nfsched vs best static ({best_static[0]}): {best_static[1] / fs[1]:.2f}x (goal >= 1.5x)")
    if cb:
        print(f"fsched vs hf-cb: {cb[1] / fs[1]:.2f}x (goal >= 1.3x)")

    with torch.inference_mode():
        step_s, park_s, recompute_s = preemption_cost(loaded, contexts=256, batch=16)
    print(f"\npreemption of a 256-token request in a batch of 16 (decode step {step_s * 1000:.1f} ms):")
    print(f"  park + restore:      {park_s * 1000:7.2f} ms = {park_s / step_s:5.2f} decode steps")
    print(f"  drop + recompute:    {recompute_s * 1000:7.2f} ms = {recompute_s / step_s:5.2f} decode steps")


def _mismatches(outs, reference) -> int:
    return sum(a != b for a, b in zip(outs, reference, strict=True))


def load_gpu_model(device: str):
    """A ~0.5B-parameter Llama with random weights (Qwen2.5-0.5B-like shape), bf16."""
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM

    from fsched.core.runners.hf.model import ensure_tiny_model, load_model

    tokenizer_dir = ensure_tiny_model()
    config = LlamaConfig(
        vocab_size=32_000,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    folder = tempfile.mkdtemp(prefix="fsched-gpu-model-")
    model.save_pretrained(folder)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return load_model(folder, device=device, dtype="auto")


if __name__ == "__main__":
    main()
