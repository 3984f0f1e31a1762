"""The isolated grammar worker and the runner's grammars, for real: a schema that segfaults the
grammar library, one that overruns the wall-clock bound, each a GrammarError saying so while the
pool goes on (its worker replaced); and on the tiny model, a grammar that fails mid-answer fails the
request, never ends it as if its output were complete."""

from __future__ import annotations

import pytest

from fsched.core.grammar import GrammarCompiler, GrammarError, GrammarLimits, GrammarSource, SourceKind
from fsched.core.grammar.pool import WorkerBudget, WorkerPool
from fsched.core.sched.request import Request
from fsched.core.types import RequestStatus, ResponseFormat, SamplingParams, canonical_json

pytestmark = pytest.mark.timeout(300)
NO_LIMITS = GrammarLimits(max_bytes=10**9, max_properties=10**9, max_optional_properties=10**9,
                          max_refs=10**9, max_ref_chain=10**9)


def chain(links: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def optional(count: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


def source(schema: dict) -> GrammarSource:
    return GrammarSource(SourceKind.JSON_SCHEMA, canonical_json(schema))


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(WorkerBudget(wall_s=3.0, workers=1))
    yield p
    p.close()


def test_a_crash_in_the_grammar_library_is_a_verdict_and_the_worker_is_replaced(pool):
    compiler = GrammarCompiler(pool.compile, NO_LIMITS)
    before = pool.replaced
    with pytest.raises(GrammarError, match="response_format: the grammar library crashed .*SIGSEGV"):
        compiler.compile(source(chain(5_000)))
    assert pool.replaced == before + 1
    assert compiler.compile(source({"type": "object"})).grammar  # the next job: a fresh worker


def test_a_compile_past_the_wall_clock_bound_is_a_verdict():
    # A bound far below this compile's time on any machine (about a second quiet, 8 s loaded), so the
    # verdict does not depend on the machine's speed.
    short = WorkerPool(WorkerBudget(wall_s=0.2, workers=1))
    try:
        compiler = GrammarCompiler(short.compile, NO_LIMITS)
        with pytest.raises(GrammarError, match="took longer than 0.2 s|of CPU time"):
            compiler.compile(source(optional(10_000)))
        # The next job goes to a fresh worker. Under the default bound: at 0.2 s even a trivial schema's
        # job can run out on a loaded machine (the worker runs below the server's priority).
        short.budget = WorkerBudget(workers=1)
        assert compiler.compile(source({"type": "string"})).grammar
        assert short.replaced >= 1
    finally:
        short.close()


def test_the_limits_refuse_the_crash_before_any_worker_sees_it(pool):
    with pytest.raises(GrammarError, match=r"\$refs"):
        GrammarCompiler(pool.compile).compile(source(chain(5_000)))


def test_a_grammar_failing_mid_answer_fails_the_request():
    from fsched.core.daemon.engine import Engine
    from fsched.core.runners.hf.model import load_model
    from fsched.core.runners.hf.runner import ModelRunner
    from fsched.core.sched.scheduler import Scheduler, SchedulerConfig

    loaded = load_model(None, device="cpu")
    runner = ModelRunner(loaded)
    runner.grammars.limits = NO_LIMITS  # past the door's limits: the library's own row limit trips
    engine = Engine(runner, Scheduler(SchedulerConfig(max_batch=4, kv_tokens=4096, step_tokens=256), "fcfs"),
                    runner.context_length)
    fmt = ResponseFormat.json_schema(optional(1_000))
    params = SamplingParams(max_tokens=16, seed=1, response_format=fmt)
    (result,) = engine.run_all([Request.to_run("r", runner.encode("hi"), params)]).values()
    assert result.status is RequestStatus.FINISHED_FAILED, (result.text, result.status)
    assert "response_format: the grammar failed mid-answer" in result.error


def test_an_honest_check_waits_for_one_hostile_job_not_for_its_queue():
    """One worker; a hostile tenant's five expensive schemas (one running, four waiting: its most), then
    an honest tenant's small one: the honest check runs after the running job and the hostile tenant's
    next (the tenants in turn), not after its whole queue; the hostile tenant's sixth is refused at once."""
    import threading
    import time

    from fsched.core.grammar.source import GrammarBusy

    one = WorkerPool(WorkerBudget(workers=1, waiting_per_tenant=4))
    done: list[str] = []
    failed: list[BaseException] = []

    def hostile(i: int) -> None:
        try:  # the first takes the worker for seconds (8,000 properties: 2 s quiet), long enough for the rest
            one.compile(source(optional(8_000 if i == 0 else 3_000 + i)), "hostile")
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            failed.append(exc)
            raise
        done.append(f"hostile{i}")

    try:
        one.compile(source({"type": "string"}), "warm")  # the worker started
        threads = [threading.Thread(target=hostile, args=(i,)) for i in range(5)]
        # The first at the worker before the others queue: five compiles of 0.3 s each, started together,
        # drained the queue before it filled on a quick machine.
        threads[0].start()
        time.sleep(0.2)
        for t in threads[1:]:
            t.start()
        deadline = time.monotonic() + 30
        while one.waiting("hostile") < 4 and time.monotonic() < deadline and not failed:
            time.sleep(0.01)
        assert one.waiting("hostile") == 4 and not done, (done, failed)  # the first still compiling
        with pytest.raises(GrammarBusy, match="4 of this tenant's JSON schemas are already waiting"):
            one.compile(source(optional(10)), "hostile")
        one.compile(source({"type": "integer"}), "honest")
        done.append("honest")
        for t in threads:
            t.join(60)
    finally:
        one.close()
    assert done.index("honest") <= 2 and len(done) == 6, done  # first come first served: 5
