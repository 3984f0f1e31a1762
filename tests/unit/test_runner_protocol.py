"""Every runner declares the Runner protocol and implements each of its members itself.

The engine drives runners only through the protocol, so a runner missing a
member, or taking its arguments differently, would fail in the middle of a
step. These checks catch that on the class, without loading a model; the
plan-level contract (tokens unchanged by preemption) runs on the stand-in
here and on the model in the engine's integration tests.
"""

from __future__ import annotations

import inspect

import pytest

from fsched.core.runners.hf.runner import ModelRunner
from fsched.core.runners.protocol import Runner, RunResult
from fsched.core.runners.remote import RemoteRunner
from fsched.core.runners.standin import StandInRunner, standin_encode
from fsched.core.sched.plan import Plan, Preemption, PrefillChunk
from fsched.core.sched.request import Checkpoint
from fsched.core.types import SamplingParams

RUNNERS = [ModelRunner, StandInRunner, RemoteRunner]


def protocol_members() -> dict[str, object]:
    return {
        name: value
        for name, value in vars(Runner).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    }


def own_member(owner_type: type, name: str) -> object:
    """The member as the runner defines it (not inherited from the protocol's empty body)."""
    for klass in owner_type.__mro__:
        if klass is Runner:
            break
        if name in vars(klass):
            return vars(klass)[name]
    raise AssertionError(f"{owner_type.__name__} does not implement {name}")


def accepts(implementation, declared) -> list[str]:
    """Why a method cannot be called as the protocol declares it (empty: it can)."""
    have = list(inspect.signature(implementation).parameters.values())
    want = list(inspect.signature(declared).parameters.values())
    problems = []
    for i, p in enumerate(want):
        if i >= len(have):
            problems.append(f"lacks parameter {p.name!r}")
            continue
        q = have[i]
        if (q.name, q.kind) != (p.name, p.kind):
            problems.append(f"parameter {i} is {q.name!r} ({q.kind}), the protocol has {p.name!r} ({p.kind})")
        if p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            problems.append(f"{p.name!r} has no default, the protocol's has one")
    for q in have[len(want):]:
        if q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            problems.append(f"extra parameter {q.name!r} without a default")
    return problems


def test_the_protocol_has_the_members_the_engine_calls():
    assert set(protocol_members()) == {
        "context_length", "kv_tokens", "encode", "add", "run", "generated", "text", "logprobs", "release"
    }


@pytest.mark.parametrize("runner_type", RUNNERS, ids=lambda c: c.__name__)
def test_each_runner_declares_and_implements_every_member(runner_type):
    assert Runner in runner_type.__mro__, f"{runner_type.__name__} does not declare the Runner protocol"
    for name, declared in protocol_members().items():
        mine = own_member(runner_type, name)
        if isinstance(declared, property):
            assert isinstance(mine, property), f"{runner_type.__name__}.{name} must be a property"
        else:
            assert inspect.isfunction(mine), f"{runner_type.__name__}.{name} must be a method"
            assert not accepts(mine, declared), f"{runner_type.__name__}.{name}: {accepts(mine, declared)}"


def test_signature_check_catches_a_mismatch():
    def add(self, request_id, prompt, params, generated, logprobs=(), extra=None, more=1, last=None): ...

    def add2(self, request_id, prompt, params, generated=(), logprobs=(), extra=None, required=0, *, k): ...

    def release(self, rid): ...

    assert accepts(add, Runner.add) == ["'generated' has no default, the protocol's has one"]
    assert accepts(add2, Runner.add) == ["extra parameter 'k' without a default"]
    assert accepts(release, Runner.release)


def test_a_stand_in_is_a_runner_at_run_time():
    runner = StandInRunner()
    assert isinstance(runner, Runner)
    assert runner.encode("a b c") == standin_encode("a b c")
    assert not isinstance(object(), Runner)


def tokens_through(runner: Runner, preempt: Checkpoint | None) -> list[int]:
    """Drive a runner with hand-made plans; preempt the request after 3 decode steps."""
    prompt = runner.encode("the contract holds for every runner")
    runner.add("r", prompt, SamplingParams(max_tokens=12, temperature=0.9, seed=7))
    step = 0

    def run(**plan) -> RunResult:
        nonlocal step
        step += 1
        return runner.run(Plan(step=step, **plan))

    first = run(prefill=(PrefillChunk("r", 0, len(prompt), True),))
    assert set(first.tokens) == {"r"} and first.outcome.elapsed_s >= 0
    for _ in range(3):
        run(decode=("r",))
    if preempt is Checkpoint.PARK:
        run(preempted=(Preemption("r", Checkpoint.PARK, runner.kv_tokens),))
        run(resumed=("r",), decode=("r",))
    elif preempt is Checkpoint.RECOMPUTE:
        run(preempted=(Preemption("r", Checkpoint.RECOMPUTE, runner.kv_tokens),))
        context = len(prompt) + len(runner.generated("r"))
        run(prefill=(PrefillChunk("r", 0, context, True),))
    while len(runner.generated("r")) < 8:
        run(decode=("r",))
    out = runner.generated("r")
    runner.release("r")
    assert runner.kv_tokens == 0
    return out[:8]


@pytest.mark.parametrize("checkpoint", [Checkpoint.PARK, Checkpoint.RECOMPUTE])
def test_preemption_leaves_the_stand_ins_tokens_unchanged(checkpoint):
    assert tokens_through(StandInRunner(), checkpoint) == tokens_through(StandInRunner(), None)
