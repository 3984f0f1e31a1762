"""The grammar pool's queue serves tenants in turn: one tenant's queue of expensive schemas keeps
another tenant's check waiting for one of its jobs at most (besides those running), and a tenant's
waiting jobs are bounded
(the pool's mechanism, with real workers, is in tests/integration/test_grammar_isolation.py)."""

from __future__ import annotations

import pytest

from fsched.core.grammar import GrammarCompiler, GrammarError
from fsched.core.grammar.fairness import FairQueue, TenantQueueFull
from fsched.core.grammar.source import GrammarBusy, GrammarSource, SourceKind


def test_an_honest_job_is_next_after_one_hostile_job_not_after_all():
    queue: FairQueue[str] = FairQueue(per_tenant=4)
    for i in range(4):
        queue.push("hostile", f"h{i}")
    queue.push("honest", "o0")
    queue.push("honest", "o1")
    assert [queue.pop() for _ in range(7)] == ["h0", "o0", "h1", "o1", "h2", "h3", None]


def test_tenants_arriving_later_join_the_turns():
    queue: FairQueue[str] = FairQueue(per_tenant=8)
    for i in range(3):
        queue.push("a", f"a{i}")
    assert queue.pop() == "a0"
    queue.push("b", "b0")
    queue.push("c", "c0")
    assert [queue.pop() for _ in range(4)] == ["a1", "b0", "c0", "a2"]
    assert len(queue) == 0


def test_a_tenant_may_have_so_many_jobs_waiting_and_no_more():
    queue: FairQueue[int] = FairQueue(per_tenant=2)
    queue.push("hostile", 1)
    queue.push("hostile", 2)
    with pytest.raises(TenantQueueFull):
        queue.push("hostile", 3)
    queue.push("honest", 4)  # another tenant's bound is its own
    assert queue.pop() == 1
    queue.push("hostile", 3)  # one left the queue: room for one more
    assert (queue.waiting("hostile"), queue.waiting("honest")) == (2, 1)


def test_a_job_taken_back_leaves_no_trace():
    queue: FairQueue[str] = FairQueue(per_tenant=2)
    queue.push("a", "a0")
    queue.push("b", "b0")
    queue.remove("a", "a0")
    queue.remove("a", "a0")  # twice: nothing more
    assert (queue.pop(), queue.pop(), len(queue)) == ("b0", None, 0)


def test_a_busy_refusal_is_not_cached_as_the_schema_s_verdict():
    answers = iter([GrammarBusy("4 of this tenant's JSON schemas are already waiting"), "compiled"])

    def backend(_source: GrammarSource, tenant: str) -> str:
        assert tenant == "hostile"
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    compiler = GrammarCompiler(backend)
    source = GrammarSource(SourceKind.JSON_SCHEMA, '{"type":"object"}')
    with pytest.raises(GrammarError, match="^response_format: 4 of this tenant's JSON schemas are already"):
        compiler.compile(source, "hostile")
    assert compiler.compile(source, "hostile").grammar == "compiled"  # sent again: compiled


def test_a_body_that_may_force_a_call_is_parsed_off_the_event_loop():
    """A required or named call's grammar waits on the pool (its turn, then the compile) as a
    response_format's does: such a body is parsed in a thread, never on serve's event loop."""
    import json

    from fsched.api.online import may_name_a_grammar

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert may_name_a_grammar(json.dumps({"messages": [], "tools": [tool], "tool_choice": "required"}))
    assert may_name_a_grammar(json.dumps({"messages": [], "response_format": {"type": "json_object"}}))
    assert not may_name_a_grammar(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
