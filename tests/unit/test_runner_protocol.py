"""Every runner declares the Runner protocol and implements each of its members itself.

The engine drives runners only through the protocol, so a runner missing a
member, or taking its arguments differently, would fail in the middle of a
step. These checks catch that on the class, without loading a model; the
plan-level contract (tokens unchanged by preemption) runs on the stand-in
here and on the model in the engine's integration tests. A runner writes a
request's output on the live record it was handed and keeps no copy of it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields

import pytest

from fsched.core.runners.hf.runner import ModelRunner
from fsched.core.runners.protocol import LiveRequest, Runner, RunResult
from fsched.core.runners.registered import Registered
from fsched.core.runners.remote import RemoteRunner
from fsched.core.runners.standin import StandInRunner, standin_encode, standin_text
from fsched.core.runners.stopping import StopRules
from fsched.core.sched.plan import Plan, Preemption, PrefillChunk
from fsched.core.sched.request import Checkpoint, Request
from fsched.core.types import RequestStatus, SamplingParams, StopCheck, TokenLogprobs

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
        "context_length", "kv_tokens", "encode", "add", "run", "text", "release"
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
    def encode(self, prompt, messages, render=None, extra=None): ...

    def add(self, request, extra=None, required=0, *, k): ...

    def release(self, rid): ...

    assert accepts(encode, Runner.encode) == ["'prompt' has no default, the protocol's has one",
                                              "'messages' has no default, the protocol's has one"]
    assert accepts(add, Runner.add) == ["extra parameter 'k' without a default"]
    assert accepts(release, Runner.release)


def test_a_stand_in_is_a_runner_at_run_time():
    runner = StandInRunner()
    assert isinstance(runner, Runner)
    assert runner.encode("a b c") == standin_encode("a b c")
    assert not isinstance(object(), Runner)


def tokens_through(runner: Runner, preempt: Checkpoint | None) -> list[int]:
    """Drive a runner with hand-made plans; preempt the request after 3 decode steps."""
    prompt = runner.encode("the contract holds for every runner")
    record = Request.to_run("r", prompt, SamplingParams(max_tokens=12, temperature=0.9, seed=7))
    runner.add(record)
    step = 0

    def run(**plan) -> RunResult:
        nonlocal step
        step += 1
        return runner.run(Plan(step=step, **plan))

    first = run(prefill=(PrefillChunk("r", 0, len(prompt), True),))
    assert set(first.tokens) == {"r"} and first.outcome.elapsed_s >= 0
    assert record.output == [first.tokens["r"]]  # the step appended it to the record
    for _ in range(3):
        run(decode=("r",))
    if preempt is Checkpoint.PARK:
        run(preempted=(Preemption("r", Checkpoint.PARK, runner.kv_tokens),))
        run(resumed=("r",), decode=("r",))
    elif preempt is Checkpoint.RECOMPUTE:
        run(preempted=(Preemption("r", Checkpoint.RECOMPUTE, runner.kv_tokens),))
        context = len(prompt) + len(record.output)
        run(prefill=(PrefillChunk("r", 0, context, True),))
    while len(record.output) < 8:
        run(decode=("r",))
    out = list(record.output)
    runner.release("r")
    assert runner.kv_tokens == 0
    return out[:8]


@pytest.mark.parametrize("checkpoint", [Checkpoint.PARK, Checkpoint.RECOMPUTE])
def test_preemption_leaves_the_stand_ins_tokens_unchanged(checkpoint):
    assert tokens_through(StandInRunner(), checkpoint) == tokens_through(StandInRunner(), None)


@dataclass(eq=False)
class Held:
    """A record as a runner sees it (`LiveRequest`), without the rest of the live `Request`."""

    id: str
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    stop: StopCheck | None = None


def run_to_end(runner: Runner, record: Held) -> None:
    runner.add(record)
    step, context = 0, len(record.prompt) + len(record.output)
    result = runner.run(Plan(step, prefill=(PrefillChunk(record.id, 0, context, True),)))
    while record.id not in result.finished:
        step += 1
        result = runner.run(Plan(step, decode=(record.id,)))
    assert result.finished[record.id] == record.stop  # reported, and kept on the record
    runner.release(record.id)


def test_a_runner_appends_its_output_to_the_record_it_was_handed_and_resumes_from_it():
    params = SamplingParams(max_tokens=6, seed=3, logprobs=2, ignore_eos=True)
    whole = Held("r", [5, 6, 7], params)
    run_to_end(StandInRunner(), whole)
    assert len(whole.output) == len(whole.output_logprobs) == 6
    assert whole.stop.finished is RequestStatus.FINISHED_LENGTH
    # A resume after a restart: the output so far is on the record; the runner goes on from it.
    resumed = Held("r", [5, 6, 7], params, whole.output[:2], whole.output_logprobs[:2])
    run_to_end(StandInRunner(), resumed)
    assert (resumed.output, resumed.output_logprobs) == (whole.output, whole.output_logprobs)
    # The text is read from the record, registered or not.
    assert StandInRunner().text(resumed) == standin_text(whole.output)


def test_runners_keep_no_copy_of_what_the_record_holds():
    """A runner's entry holds the record itself and its own derived and device state, never a second
    copy of the request's tokens, parameters, logprobs or finish."""
    from fsched.core.runners.hf.runner import _ModelRequest
    from fsched.core.runners.remote import _Request
    from fsched.core.runners.standin import _StandInRequest

    record_fields = {*LiveRequest.__annotations__, "tokens", "prompt_len", "logprobs", "finish", "generated"}
    assert {f.name for f in fields(Registered)} == {"request", "rules", "text", "shown"}
    for entry in (_ModelRequest, _Request, _StandInRequest):
        assert not {f.name for f in fields(entry)} & record_fields, entry.__name__


def test_an_entry_reads_its_context_across_prompt_and_output():
    entry = Registered(Held("r", [1, 2, 3], SamplingParams(max_tokens=4), [4, 5]), StopRules())
    assert (entry.context, entry.last) == (5, 5)
    assert [entry.tokens(), entry.tokens(0, 2), entry.tokens(2, 4), entry.tokens(3, 5)] == [
        [1, 2, 3, 4, 5], [1, 2], [3, 4], [4, 5]]
    assert Registered(Held("p", [9], SamplingParams(max_tokens=4)), StopRules()).last == 9
