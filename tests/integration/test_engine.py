"""The engine on the real tiny model: batching, preemption and sampling change no output."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from fsched.core.daemon.engine import Engine  # noqa: E402
from fsched.core.runners.hf.model import load_model  # noqa: E402
from fsched.core.runners.hf.runner import ModelRunner  # noqa: E402
from fsched.core.sched.config import SchedulerConfig  # noqa: E402
from fsched.core.sched.request import Request  # noqa: E402
from fsched.core.sched.scheduler import Scheduler  # noqa: E402
from fsched.core.types import RequestClass, RequestStatus, SamplingParams  # noqa: E402

# 48 requests of 8-32 new tokens (~1,000 tokens): enough for continuous batching (requests ending and
# joining at every step), for a batch of 32 to refill, and for five or more preemptions under realtime
# arrivals; the one-at-a-time reference below costs about 10 ms a token on one core.
N_REQUESTS = 48


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    import os

    old = os.environ.get("XDG_CACHE_HOME")
    from tests.support.model_cache import shared_model_cache

    os.environ["XDG_CACHE_HOME"] = shared_model_cache(tmp_path_factory)
    try:
        torch.set_num_threads(1)  # the suite runs two workers on two cores: one thread each
        yield load_model(None)
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="module")
def tiny64(tiny):
    """The tiny model in float64: a seeded draw compared across batch shapes (preemption, parking,
    recompute) must not meet a CDF boundary within the last bits that batch shapes change, which fp32
    cannot promise on every CPU (the kernels differ by instruction set)."""
    return load_model(None, dtype="float64")


def workload(tiny, seed=0, temperature=0.0, n=N_REQUESTS, max_out=32, mixed=False):
    rng = random.Random(seed)
    vocab = len(tiny.tokenizer)
    requests = []
    for i in range(n):
        params = SamplingParams(
            max_tokens=rng.randint(8, max_out),
            temperature=temperature,
            top_p=0.9 if temperature else 1.0,
            seed=1000 + i,
            **(mixed_sampling(rng, vocab) if mixed else {}),
        )
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(16, 128))]
        requests.append(Request.to_run(id=f"r{i}", prompt=prompt, params=params))
    return requests


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
          "maximum": 99}}, "required": ["ok", "n"], "additionalProperties": False}


def mixed_sampling(rng, vocab) -> dict:
    """Every sampling field, each at a random non-neutral value for about half the requests."""
    from fsched.core.types import ResponseFormat

    maybe = lambda value: value if rng.random() < 0.5 else None  # noqa: E731
    fields = {
        "presence_penalty": maybe(rng.uniform(-1, 2)), "frequency_penalty": maybe(rng.uniform(-1, 2)),
        "repetition_penalty": maybe(rng.uniform(0.7, 1.5)), "min_p": maybe(rng.uniform(0, 0.2)),
        "logit_bias": maybe(SamplingParams.logit_bias_of({rng.randrange(vocab): rng.uniform(-50, 50)
                                                         for _ in range(4)})),
        "min_tokens": maybe(rng.randint(1, 8)), "ignore_eos": maybe(True),
        "stop_token_ids": maybe((rng.randrange(vocab),)), "logprobs": maybe(rng.randint(0, 5)),
        "top_k": maybe(rng.randint(1, 50)),
        "response_format": ResponseFormat.json_schema(SCHEMA) if rng.random() < 0.2 else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


@pytest.fixture(scope="session")
def reference(tiny):
    """One-at-a-time greedy `model.generate`: the outputs every engine run must equal."""
    outputs = {}
    with torch.inference_mode():
        for r in workload(tiny):
            out = tiny.model.generate(
                torch.tensor([r.prompt]),
                max_new_tokens=r.params.max_tokens,
                do_sample=False,
                pad_token_id=tiny.tokenizer.pad_token_id,
            )
            outputs[r.id] = out[0, len(r.prompt) :].tolist()
    return outputs


def run(tiny, requests, policy="fcfs", on_step=None, **config):
    defaults = dict(max_batch=32, kv_tokens=16_384, step_tokens=512)
    scheduler = Scheduler(SchedulerConfig(**{**defaults, **config}), policy)
    engine = Engine(ModelRunner(tiny), scheduler, tiny.context_length)
    return engine, engine.run_all(requests, on_step=on_step)


def tokens(results):
    return {rid: r.tokens for rid, r in results.items()}


@pytest.mark.parametrize("max_batch", [1, 8, 32])
def test_batched_greedy_equals_one_at_a_time_generate(tiny, reference, max_batch):
    # One row at a time is the slow case (a step per token): 16 requests show it.
    requests = workload(tiny)[:16] if max_batch == 1 else workload(tiny)
    engine, results = run(tiny, requests, max_batch=max_batch)
    assert tokens(results) == {r.id: reference[r.id] for r in requests}
    assert all(r.status.succeeded for r in results.values())
    if max_batch > 1:
        assert engine.steps < sum(len(t) for t in reference.values())  # it really batched


def with_realtime_interruptions(tiny, requests, seed):
    """Batch work plus realtime requests arriving at random steps: each arrival
    preempts a batch request under the `priority` policy (forced preemption)."""
    rng = random.Random(seed)
    realtime = workload(tiny, seed=99, n=12, max_out=12)
    for r in realtime:
        r.id = "rt-" + r.id
        r.request_class = RequestClass.REALTIME
    arrivals = sorted(rng.sample(range(5, 150), len(realtime)))
    return realtime, arrivals


def run_interrupted(tiny, config, batch, realtime, arrivals):
    """Run `batch` under the `priority` policy, adding `realtime` requests at the given steps."""
    engine = Engine(ModelRunner(tiny), Scheduler(config, "priority"), tiny.context_length)
    for r in batch:
        engine.add(r)
    results, step = {}, 0
    while engine.has_work:
        while arrivals and arrivals[0] <= step:
            arrivals.pop(0)
            engine.add(realtime.pop(0))
        report = engine.step()
        step += 1
        for r in report.finished if report else []:
            results[r.id] = r
    return engine, results


@pytest.mark.parametrize("host_kv_tokens", [100_000, 0], ids=["park", "recompute"])
def test_forced_preemptions_change_no_output(tiny, reference, host_kv_tokens):
    batch = workload(tiny)
    realtime, arrivals = with_realtime_interruptions(tiny, batch, seed=host_kv_tokens)
    config = SchedulerConfig(
        max_batch=6, kv_tokens=16_384, step_tokens=512, min_quantum_steps=2, host_kv_tokens=host_kv_tokens
    )
    engine, results = run_interrupted(tiny, config, batch, realtime, arrivals)
    runner = engine.runner
    assert engine.scheduler.preemptions >= 5
    if host_kv_tokens:
        assert runner.parks >= 5 and runner.recomputes == 0
    else:
        assert runner.recomputes >= 5 and runner.parks == 0
    assert {rid: t for rid, t in tokens(results).items() if not rid.startswith("rt-")} == reference


def logprobs(results):
    return {rid: r.logprobs for rid, r in results.items()}


def same_logprobs(a, b) -> bool:
    """Equal tokens and texts, and logprobs equal within float noise: a batch of another size
    computes the same logits up to the last bits."""
    if a.keys() != b.keys():
        return False
    for rid in a:
        flat_a = [(t.chosen, *t.top) for t in a[rid]]
        flat_b = [(t.chosen, *t.top) for t in b[rid]]
        def named(flat):
            return [[(x.token, x.text) for x in t] for t in flat]

        if named(flat_a) != named(flat_b):
            return False
        if [x.logprob for t in flat_a for x in t] != pytest.approx([x.logprob for t in flat_b for x in t],
                                                                     abs=1e-4):
            return False
    return True


SAMPLED_N = 24


@pytest.fixture(scope="module")
def greedy_of_sampled(tiny64):
    """The greedy outputs of the sampled workload's prompts (one run for both variants)."""
    return tokens(run(tiny64, workload(tiny64, seed=5, n=SAMPLED_N), max_batch=32)[1])


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "every-field"])
def test_seeded_sampling_is_the_same_with_and_without_preemption(tiny64, greedy_of_sampled, mixed):
    tiny = tiny64
    n = SAMPLED_N
    sampled = workload(tiny, seed=5, temperature=0.8, n=n, mixed=mixed)
    _, calm = run(tiny, sampled, max_batch=32)
    rerun = workload(tiny, seed=5, temperature=0.8, n=n, mixed=mixed)
    realtime, arrivals = with_realtime_interruptions(tiny, rerun, seed=3)
    config = SchedulerConfig(
        max_batch=4, kv_tokens=16_384, step_tokens=512, min_quantum_steps=2, host_kv_tokens=80
    )  # some parked, the rest recomputed
    engine, busy = run_interrupted(tiny, config, rerun, realtime, arrivals)
    assert engine.runner.parks >= 1 and engine.runner.recomputes >= 1
    assert {k: v for k, v in tokens(busy).items() if not k.startswith("rt-")} == tokens(calm)
    assert same_logprobs({k: v for k, v in logprobs(busy).items() if not k.startswith("rt-")}, logprobs(calm))
    if mixed:
        asked = [r for r in sampled if r.params.logprobs is not None]
        assert asked and all(len(calm[r.id].logprobs) == len(calm[r.id].tokens) for r in asked)
    # Sampling really sampled: outputs differ from greedy ones.
    assert greedy_of_sampled != tokens(calm)


def test_kv_budget_is_never_exceeded(tiny):
    budget = 1_200
    seen = []
    scheduler = Scheduler(SchedulerConfig(max_batch=16, kv_tokens=budget, step_tokens=256), "fcfs")
    engine = Engine(ModelRunner(tiny), scheduler, tiny.context_length)
    results = engine.run_all(workload(tiny, n=32), on_step=lambda _: seen.append(engine.runner.kv_tokens))
    assert len(results) == 32 and all(r.error is None for r in results.values())
    assert max(seen) <= budget
    assert max(seen) > budget // 2  # the budget was actually the limit
    assert engine.runner.kv_tokens == 0  # everything released


def test_prompt_longer_than_the_context_fails_alone(tiny, reference):
    requests = workload(tiny, n=4)
    too_long = Request.to_run(
        id="long", prompt=[5] * (tiny.context_length + 10), params=SamplingParams(max_tokens=4, temperature=0)
    )
    _, results = run(tiny, [too_long, *requests])
    assert results["long"].status is RequestStatus.FINISHED_FAILED
    assert results["long"].error == (
        f"the prompt is {tiny.context_length + 10} tokens; the model's context holds {tiny.context_length}"
    )
    assert {rid: r.tokens for rid, r in results.items() if rid != "long"} == {
        rid: reference[rid] for rid in ("r0", "r1", "r2", "r3")
    }


def test_resume_from_generated_tokens_continues_the_same_output(tiny, reference):
    """A restarted daemon hands the engine the tokens flushed so far."""
    requests = workload(tiny, n=8)
    for r in requests:
        r.resume_from(reference[r.id][: len(reference[r.id]) // 2])
    _, results = run(tiny, requests)
    for r in requests:
        assert results[r.id].tokens == reference[r.id]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_resume_with_every_field_continues_the_same_output_and_logprobs(tiny, temperature):
    """Penalties, grammar state and logprobs are rebuilt from the flushed tokens (and their logprobs)."""
    whole = {rid: r for rid, r in run(tiny, workload(tiny, seed=8, temperature=temperature, n=16,
                                                      mixed=True))[1].items()}
    resumed = workload(tiny, seed=8, temperature=temperature, n=16, mixed=True)
    for r in resumed:
        k = len(whole[r.id].tokens) // 2
        r.resume_from(whole[r.id].tokens[:k], whole[r.id].logprobs[:k])
    _, results = run(tiny, resumed)
    assert tokens(results) == tokens(whole) and same_logprobs(logprobs(results), logprobs(whole))
    assert any(r.params.response_format for r in resumed) and any(r.params.penalized for r in resumed)


def test_stop_strings_and_eos(tiny):

    prompt = tiny.tokenizer("The train left the coast at dawn")["input_ids"]
    free = Request.to_run("free", prompt, SamplingParams(max_tokens=40, temperature=0))
    _, results = run(tiny, [free])
    text = results["free"].text
    assert results["free"].status is RequestStatus.FINISHED_LENGTH and len(text) > 10
    stop = text[5:8]
    stopped = Request.to_run("stopped", prompt, SamplingParams(max_tokens=40, temperature=0, stop=(stop,)))
    _, results = run(tiny, [stopped])
    assert results["stopped"].status is RequestStatus.FINISHED_STOPPED
    assert results["stopped"].text == text[: text.index(stop)]
    # Stop strings of every length, anywhere (most span tokens), in one batch: each found where the
    # whole text has it first, as when the whole output was decoded at every token.
    stops = {f"s{i}": (text[i : i + n],) for i, n in ((0, 1), (3, 7), (9, 2), (12, 12), (20, 5), (30, 9))
             if text[i : i + n].strip()}
    _, results = run(tiny, [Request.to_run(rid, prompt, SamplingParams(max_tokens=40, temperature=0, stop=s))
                            for rid, s in stops.items()])
    for rid, (s,) in stops.items():
        assert results[rid].text == text[: text.index(s)], (s, results[rid].text)
        assert results[rid].status is RequestStatus.FINISHED_STOPPED


def test_cancel_mid_run_frees_the_request_and_changes_no_other_output(tiny, reference):
    requests = workload(tiny, n=12)
    scheduler = Scheduler(SchedulerConfig(max_batch=8, kv_tokens=16_384, step_tokens=512), "fcfs")
    engine = Engine(ModelRunner(tiny), scheduler, tiny.context_length)
    for r in requests:
        engine.add(r)
    results = {}
    for _ in range(3):
        for r in engine.step().finished:
            results[r.id] = r
    victims = [rid for rid in engine.request_ids if rid in engine.scheduler.running][:2]
    assert len(victims) == 2
    for rid in victims:  # outside any inference context, as the daemon calls it
        assert engine.cancel(rid)
    while engine.has_work:
        report = engine.step()
        for r in report.finished if report else []:
            results[r.id] = r
    assert set(results) == {r.id for r in requests} - set(victims)
    assert all(results[rid].tokens == reference[rid] for rid in results)
    assert engine.runner.kv_tokens == 0


def test_a_gpt2_style_model_loads_and_batches_exactly(tiny, tmp_path):
    """Any AutoModelForCausalLM: a GPT-2 config (learned positions, fused attention) built
    here, saved, and loaded through the same path as a real model folder."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tiny.tokenizer), n_positions=512, n_embd=64, n_layer=2, n_head=2,
                        initializer_range=0.1, bos_token_id=tiny.tokenizer.bos_token_id,
                        eos_token_id=tiny.tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tiny.tokenizer.save_pretrained(tmp_path / "gpt2")
    gpt2 = load_model(str(tmp_path / "gpt2"), device="cpu")
    assert gpt2.context_length == 512 and not gpt2.is_tiny
    requests = workload(gpt2, seed=11, n=12, max_out=16)
    expected = {}
    with torch.inference_mode():
        for r in requests:
            out = gpt2.model.generate(torch.tensor([r.prompt]), max_new_tokens=r.params.max_tokens,
                                      do_sample=False, pad_token_id=gpt2.tokenizer.pad_token_id)
            expected[r.id] = out[0, len(r.prompt):].tolist()
    _, results = run(gpt2, requests, max_batch=8)
    assert tokens(results) == expected


def test_chat_requests_use_the_chat_template(tiny):
    from fsched.core.runners.hf.model import encode_prompt

    messages = [{"role": "user", "content": "Hello there"}]
    ids = encode_prompt(tiny, messages=messages)
    assert tiny.tokenizer.decode(ids) == tiny.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    assert "assistant:" in tiny.tokenizer.decode(ids)
