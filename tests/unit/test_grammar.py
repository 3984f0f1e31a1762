"""core/grammar's pure parts: sources named by content, the size limits, the verdict cache, the
compiler's caching of successes and refusals; and the engine holding a request whose grammar is
compiling apart from the step loop (a stand-in runner with futures the test resolves)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from fsched.core.daemon.engine import Engine
from fsched.core.grammar import GrammarCompiler, GrammarError, GrammarLimits, GrammarSource, SourceKind
from fsched.core.grammar.cache import VerdictCache
from fsched.core.grammar.limits import ref_chain
from fsched.core.runners.standin import StandInRunner
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler, SchedulerConfig
from fsched.core.types import (
    RequestStatus,
    ResponseFormat,
    ResponseFormatType,
    SamplingParams,
    canonical_json,
)


def schema_source(schema: dict) -> GrammarSource:
    return GrammarSource(SourceKind.JSON_SCHEMA, canonical_json(schema))


def chain(links: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def test_a_source_is_named_by_its_content():
    a = GrammarSource.of(ResponseFormat.json_schema({"type": "object", "required": [], "properties": {}}))
    b = GrammarSource.of(ResponseFormat.json_schema({"properties": {}, "required": [], "type": "object"}))
    assert a.key == b.key
    assert a.key != GrammarSource.of(ResponseFormat(ResponseFormatType.JSON_OBJECT)).key
    assert GrammarSource(SourceKind.LARK, a.text).key != a.key


def test_ref_chains_are_measured_without_recursion_and_cycles_count_once():
    assert ref_chain(chain(5)) == 6
    assert ref_chain(chain(50_000)) == 50_001  # far past Python's recursion limit
    cyclic = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"items": {"$ref": "#/$defs/a"}}}}
    assert ref_chain(cyclic) == 2
    assert ref_chain({"type": "string"}) == 0


@pytest.mark.parametrize(("schema", "words"), [
    (chain(100), "$refs chain 101"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(401)}}, "401 optional properties"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5001)},
      "required": [f"p{i}" for i in range(5001)]}, "5001 properties"),
    ({"anyOf": [{"$ref": "#/$defs/x"}] * 1001, "$defs": {"x": {}}}, "1001 $refs"),
])
def test_each_limit_refuses_with_its_name(schema, words):
    with pytest.raises(GrammarError, match=words.replace("$", r"\$")):
        GrammarLimits().check(schema_source(schema))


def test_size_and_depth_limits():
    with pytest.raises(GrammarError, match="bytes"):
        GrammarLimits(max_bytes=100).check(schema_source({"description": "x" * 200}))
    deep: dict = {}
    for _ in range(70):
        deep = {"items": deep}
    with pytest.raises(GrammarError, match="nests deeper"):
        GrammarLimits().check(schema_source(deep))
    GrammarLimits().check(schema_source({"type": "object", "properties": {f"p{i}": {} for i in range(400)}}))


def test_the_cache_drops_the_least_recently_used():
    cache: VerdictCache[int] = VerdictCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert (cache.hits, cache.misses) == (3, 1)


def test_the_compiler_caches_successes_and_refusals_by_content():
    calls = []

    def backend(source: GrammarSource, _tenant: str) -> str:
        calls.append(source.key)
        if "bad" in source.text:
            raise GrammarError("the JSON schema cannot be used: bad")
        return "compiled"

    compiler = GrammarCompiler(backend)
    good, bad = schema_source({"type": "object"}), schema_source({"description": "bad"})
    assert compiler.compile(good).grammar == compiler.compile(good).grammar == "compiled"
    for _ in range(2):
        with pytest.raises(GrammarError, match="^response_format: the JSON schema cannot be used: bad"):
            compiler.compile(bad)
    with pytest.raises(GrammarError, match="response_format: .*101"):
        compiler.compile(schema_source(chain(100)))  # the limits: the backend never sees it
    assert calls == [good.key, bad.key]


class PreparingRunner(StandInRunner):
    """The stand-in, with a grammar compile per request that the test ends."""

    def __init__(self):
        super().__init__()
        self.futures: list[Future] = []

    def prepare(self, params: SamplingParams) -> Future | None:
        if params.response_format is None:
            return None
        self.futures.append(Future())
        return self.futures[-1]


def engine_over(runner: StandInRunner) -> Engine:
    return Engine(runner, Scheduler(SchedulerConfig(max_batch=8, kv_tokens=4096, step_tokens=256), "fcfs"),
                  runner.context_length)


def test_a_request_waits_off_the_step_loop_until_its_grammar_is_compiled():
    runner = PreparingRunner()
    engine = engine_over(runner)
    structured = SamplingParams(max_tokens=4, response_format=ResponseFormat(ResponseFormatType.JSON_OBJECT))
    assert engine.add(Request.to_run("s", [1, 2], structured)) is None
    assert engine.add(Request.to_run("f", [1, 2], structured)) is None
    assert engine.add(Request.to_run("plain", [1, 2], SamplingParams(max_tokens=4))) is None
    report = engine.step()  # the plain request runs; the others wait on their compiles
    assert set(report.tokens) == {"plain"}
    assert sorted(engine.request_ids) == ["f", "plain", "s"]
    runner.futures[0].set_result(None)
    runner.futures[1].set_exception(GrammarError("the JSON schema cannot be used: no"))
    report = engine.step()
    assert "s" in report.tokens
    (failed,) = [r for r in report.finished if r.id == "f"]
    assert failed.status is RequestStatus.FINISHED_FAILED
    assert failed.error == "response_format: the JSON schema cannot be used: no"


def test_a_request_cancelled_while_its_grammar_compiles_is_gone():
    runner = PreparingRunner()
    engine = engine_over(runner)
    structured = SamplingParams(max_tokens=4, response_format=ResponseFormat(ResponseFormatType.JSON_OBJECT))
    engine.add(Request.to_run("s", [1, 2], structured))
    assert engine.has_work and engine.cancel("s")
    runner.futures[0].set_result(None)
    assert not engine.has_work and engine.step() is None
