"""The stand-in runner: deterministic tokens, the ModelRunner's plan semantics, its --model spec."""

from __future__ import annotations

import random

import pytest

from fsched.core.daemon.engine import Engine
from fsched.core.runners.standin import (
    STANDIN_CONTEXT,
    STANDIN_EOS,
    StandInError,
    StandInRunner,
    parse_standin,
    standin_encode,
    standin_text,
    standin_token,
)
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import Checkpoint, Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, SamplingParams


def requests(seed: int = 0, n: int = 48, max_out: int = 48, request_class=RequestClass.BATCH,
             prefix: str = "r"):
    rng = random.Random(seed)
    return [
        Request.to_run(
            id=f"{prefix}{i}",
            prompt=standin_encode(" ".join(f"w{rng.randrange(500)}" for _ in range(rng.randint(4, 120)))),
            params=SamplingParams(max_tokens=rng.randint(4, max_out), temperature=0.8, seed=1000 + i),
            request_class=request_class,
        )
        for i in range(n)
    ]


def run_all(reqs, policy="fcfs", **config):
    defaults = dict(max_batch=32, kv_tokens=16_384, step_tokens=512)
    runner = StandInRunner()
    scheduler = Scheduler(SchedulerConfig(**{**defaults, **config}), policy)
    engine = Engine(runner, scheduler, runner.context_length)
    return {rid: r.tokens for rid, r in engine.run_all(reqs).items()}


def test_a_token_depends_on_seed_prompt_and_position_only():
    prompt = standin_encode("the same prompt")
    assert prompt == standin_encode("the same prompt")
    assert standin_token(7, prompt) == standin_token(7, list(prompt))
    assert standin_token(7, prompt) != standin_token(8, prompt)
    assert standin_token(7, prompt) != standin_token(7, prompt + [5])
    chat = standin_encode(messages=[{"role": "user", "content": "hi"}])
    assert chat == standin_encode("user: hi assistant:")
    assert standin_text([5, STANDIN_EOS, 6]) == "w5 w6"


def test_same_seed_and_prompt_give_the_same_tokens_whatever_the_batch():
    alone = {}
    for r in requests():
        alone.update(run_all([r]))
    assert run_all(requests(), max_batch=32) == alone
    assert run_all(requests(), max_batch=3, step_tokens=64) == alone  # chunked prefills, small batches
    other_seeds = requests()
    for r in other_seeds:
        r.params = SamplingParams(max_tokens=r.params.max_tokens, temperature=0.8, seed=r.params.seed + 1)
    assert run_all(other_seeds) != alone
    assert {len(t) for t in alone.values()} != {1}  # outputs of varied lengths


def test_a_restarted_request_continues_its_output():
    """The daemon hands a reclaimed request its flushed tokens: the rest is the same."""
    full = run_all(requests(n=8))
    resumed = requests(n=8)
    for r in resumed:
        r.resume_from(full[r.id][: len(full[r.id]) // 2])
    assert run_all(resumed) == full


@pytest.mark.parametrize("host_kv_tokens", [100_000, 0], ids=["park", "recompute"])
def test_forced_preemptions_change_no_output(host_kv_tokens):
    """Realtime arrivals under the `priority` policy preempt batch requests (as in
    tests/integration/test_engine.py on the real model): outputs are unchanged."""
    calm = run_all(requests())
    runner = StandInRunner()
    config = SchedulerConfig(max_batch=6, kv_tokens=16_384, step_tokens=512, min_quantum_steps=2,
                             host_kv_tokens=host_kv_tokens)
    engine = Engine(runner, Scheduler(config, "priority"), runner.context_length)
    checkpoints = []
    run = runner.run

    def recording(plan):
        checkpoints.extend(p.checkpoint for p in plan.preempted)
        return run(plan)

    runner.run = recording
    for r in requests():
        engine.add(r)
    realtime = requests(seed=99, n=12, max_out=12, request_class=RequestClass.REALTIME, prefix="rt")
    arrivals = sorted(random.Random(1).sample(range(5, 150), len(realtime)))
    results, step = {}, 0
    while engine.has_work:
        while arrivals and arrivals[0] <= step:
            arrivals.pop(0)
            engine.add(realtime.pop(0))
        report = engine.step()
        step += 1
        for r in report.finished if report else []:
            results[r.id] = r.tokens
    expected = Checkpoint.PARK if host_kv_tokens else Checkpoint.RECOMPUTE
    assert len(checkpoints) >= 5 and set(checkpoints) == {expected}
    assert {rid: t for rid, t in results.items() if not rid.startswith("rt")} == calm
    assert runner.kv_tokens == 0


def test_context_limit_and_injected_faults():
    runner = StandInRunner(context_length=16)
    engine = Engine(runner, Scheduler(SchedulerConfig(max_batch=4, kv_tokens=1_024, step_tokens=64)),
                    runner.context_length)
    prompt = standin_encode("a b c d e f g h i j")
    (result,) = engine.run_all([Request.to_run("x", prompt, SamplingParams(max_tokens=100, seed=1))]).values()
    assert len(prompt) + len(result.tokens) <= 16  # stopped by the context, not max_tokens
    boom = StandInRunner(fail_when=lambda plan: RuntimeError("injected") if plan.step == 2 else None)
    engine = Engine(boom, Scheduler(SchedulerConfig(max_batch=4, kv_tokens=1_024, step_tokens=64)), 100)
    engine.add(Request.to_run("y", prompt, SamplingParams(max_tokens=10, seed=1)))
    engine.step()
    engine.step()
    with pytest.raises(Exception, match="injected"):
        engine.step()


@pytest.mark.parametrize("spec, step_s", [
    ("standin", 0.0), ("standin:5ms", 0.005), ("standin:2", 0.002), ("standin:0ms", 0.0),
    ("standin:60000ms", 60.0), (None, None), ("gpt2", None), ("standins", None), ("./standin", None),
])
def test_parse_standin(spec, step_s):
    assert parse_standin(spec) == step_s


@pytest.mark.parametrize("spec, message", [
    ("standin:fast", "write standin or standin:<ms per step>"),
    ("standin:5s", "write standin or standin:<ms per step>"),
    ("standin:-1", "within 0..60000 ms"),
    ("standin:60001", "within 0..60000 ms"),
    ("standin:nan", "within 0..60000 ms"),
])
def test_parse_standin_errors_name_the_spec(spec, message):
    with pytest.raises(StandInError, match=message) as error:
        parse_standin(spec)
    assert repr(spec) in str(error.value)


def test_context_length_default():
    assert StandInRunner().context_length == STANDIN_CONTEXT
