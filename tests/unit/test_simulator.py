"""The simulator: event-driven skipping equals step-by-step replay; metrics;
the `fsched simulate` command end to end."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sim.costmodel import CostModel
from fsched.core.sim.metrics import jain_index, percentile
from fsched.core.sim.simulator import simulate
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass

CFG = SchedulerConfig(max_batch=6, kv_tokens=20_000, step_tokens=600, min_quantum_steps=3)

traces = st.lists(
    st.tuples(
        st.floats(0, 30), st.sampled_from(["a", "b"]), st.sampled_from(list(RequestClass)),
        st.integers(1, 3_000), st.integers(1, 150),
    ),
    min_size=1, max_size=40,
).map(lambda xs: sorted((TraceRequest(*x) for x in xs), key=lambda r: r.arrival_s))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, policy=st.sampled_from(["fcfs", "priority", "vtc"]))
def test_skipping_ahead_equals_stepping_for_usage_blind_decisions(trace, policy):
    """fcfs, priority and vtc decide on counts, not on decayed usage, so the
    event-driven run must reproduce the step-by-step run exactly."""
    fast = simulate(trace, policy, weights={"a": 3, "b": 1}, config=CFG)
    slow = simulate(trace, policy, weights={"a": 3, "b": 1}, config=CFG, jump=False)
    assert fast.steps == slow.steps
    assert fast.preemptions == slow.preemptions
    for f, s in zip(fast.records, slow.records, strict=True):
        assert f.first_token_s == pytest.approx(s.first_token_s, rel=1e-9, abs=1e-9)
        assert f.finish_s == pytest.approx(s.finish_s, rel=1e-9, abs=1e-9)
    assert fast.decisions <= slow.decisions


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces)
def test_skipping_ahead_matches_stepping_for_fsched(trace):
    """fsched's order reads decayed usage, which the skip integrates in one
    go (KV at the run's midpoint): the same work, the same finish times to
    within a few steps."""
    fast = simulate(trace, "fsched", weights={"a": 3, "b": 1}, config=CFG)
    slow = simulate(trace, "fsched", weights={"a": 3, "b": 1}, config=CFG, jump=False)
    assert fast.makespan_s == pytest.approx(slow.makespan_s, rel=0.05)
    assert fast.steps == pytest.approx(slow.steps, rel=0.05)


def test_the_skip_saves_decisions_on_a_real_shape():
    trace = [TraceRequest(i * 0.05, "a", RequestClass.BATCH, 200, 400) for i in range(60)]
    fast = simulate(trace, "fsched", config=CFG)
    assert fast.decisions * 5 < fast.steps


def test_metric_functions():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == pytest.approx(99)
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)


def test_report_is_consistent_with_its_records():
    trace = [
        TraceRequest(i * 0.2, "ab"[i % 2], list(RequestClass)[i % 3], 100 + i, 20 + i)
        for i in range(30)
    ]
    rep = simulate(trace, "fsched", weights={"a": 3, "b": 1}, config=CFG, cost=CostModel())
    assert sum(c.count for c in rep.classes.values()) == 30
    assert rep.makespan_s == pytest.approx(max(r.finish_s for r in rep.records))
    out = sum(r.output_tokens for r in rep.records)
    assert rep.throughput_tok_s == pytest.approx(out / rep.makespan_s)
    assert all(r.first_token_s >= r.arrival_s and r.finish_s >= r.first_token_s for r in rep.records)
    assert rep.tenants["a"].entitled == 0.75
    assert sum(t.share for t in rep.tenants.values()) == pytest.approx(1.0)
    for c, stats in rep.classes.items():
        target = CFG.target_s(RequestClass(c))
        on = sum(r.first_token_s - r.arrival_s <= target for r in rep.records if r.request_class.value == c)
        assert stats.on_target == pytest.approx(on / stats.count)
        assert stats.goodput_per_s == pytest.approx(on / rep.makespan_s)


def test_preemption_cost_counts_the_kv_each_preemption_parks_or_drops():
    """Batch fills the machine, then realtime arrives: the realtime work preempts batch. Every token
    computed is counted once (prefills, recomputed prefills, decodes), and the cost is the KV the
    preemptions parked or dropped over it."""
    cfg = SchedulerConfig(max_batch=4, kv_tokens=8_000, step_tokens=600, min_quantum_steps=2,
                          host_kv_tokens=1_000, max_recompute_tokens=10_000)
    trace = [TraceRequest(0.0, "a", RequestClass.BATCH, 1_500, 300) for _ in range(4)]
    trace += [TraceRequest(1.0 + i * 0.01, "a", RequestClass.REALTIME, 400, 5) for i in range(4)]
    seen: dict[str, int] = {"parked": 0, "recomputed": 0}

    def observe(now, plan, sched):
        for p in plan.preempted:
            seen["parked" if p.checkpoint == "park" else "recomputed"] += p.kv_tokens

    rep = simulate(trace, "fsched", config=cfg, cost=CostModel(), observer=observe)
    work = rep.work
    assert rep.preemptions > 0 and work.parked + work.recomputed > 0
    assert (work.parked, work.recomputed) == (seen["parked"], seen["recomputed"])
    decoded = sum(r.output_tokens for r in trace)
    prefilled = sum(r.prompt_tokens for r in trace)
    # every prompt once, every output token once, and each dropped context again
    assert work.computed >= prefilled + decoded - len(trace)
    assert work.computed <= prefilled + decoded + work.recomputed
    assert work.preemption_cost == pytest.approx((work.parked + work.recomputed) / work.computed)
    assert rep.to_json()["preemption_cost"] == work.preemption_cost


SCHEMA_CLASS = {"count", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "jct_p50_s",
                "jct_p99_s", "max_wait_s", "on_target", "goodput_per_s"}
SCHEMA_POLICY = {"classes", "throughput_tok_s", "tenants", "jain_index", "max_wait_s",
                 "preemptions", "preemption_cost", "tokens_computed", "tokens_recomputed", "tokens_parked",
                 "backfilled", "rejected", "makespan_s"}


@pytest.fixture
def small_trace(tmp_path):
    p = tmp_path / "small.jsonl"
    lines = [
        {"arrival_s": i * 0.05, "prompt_tokens": 50 + 13 * i, "output_tokens": 5 + i % 40}
        for i in range(120)
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return p


def test_simulate_command_json_schema(small_trace):
    from fsched.cli.main import app

    result = CliRunner().invoke(
        app,
        ["simulate", str(small_trace), "--policy", "fcfs", "--policy", "fsched",
         "--tenants", "a=3,b=1", "--mix", "realtime=0.1,streaming=0.2,batch=0.7",
         "--rate-scale", "2", "--limit", "100", "--seed", "3", "--max-batch", "8",
         "--kv-tokens", "50000", "--json"],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"trace", "cost_model", "requests", "policies"}
    assert doc["cost_model"] == "tiny-cpu"  # the engine fsched runs by default, as calibrated
    assert doc["requests"] == 100
    assert set(doc["policies"]) == {"fcfs", "fsched"}
    for pol in doc["policies"].values():
        assert set(pol) == SCHEMA_POLICY
        assert set(pol["tenants"]) == {"a", "b"}
        for t in pol["tenants"].values():
            assert set(t) == {"weight", "entitled", "share", "classes"}
            for c in t["classes"].values():
                assert set(c) == SCHEMA_CLASS
        for name, c in pol["classes"].items():
            assert set(c) == SCHEMA_CLASS
            # per tenant and class: the counts add up to the class's
            assert sum(t["classes"].get(name, {"count": 0})["count"] for t in pol["tenants"].values()) \
                == c["count"]
        assert sum(c["count"] for c in pol["classes"].values()) == 100
        assert pol["rejected"] == 0


def test_a_request_beyond_the_kv_budget_is_refused_alone():
    cfg = SchedulerConfig(max_batch=4, kv_tokens=2_000, step_tokens=600, min_quantum_steps=2)
    trace = [TraceRequest(0.0, "a", RequestClass.BATCH, 100, 20),
             TraceRequest(0.1, "a", RequestClass.REALTIME, 5_000, 20),  # can never fit
             TraceRequest(0.2, "b", RequestClass.BATCH, 100, 20)]
    for policy in ("fcfs", "fsched"):
        rep = simulate(trace, policy, config=cfg)
        assert rep.rejected == 1
        assert sum(c.count for c in rep.classes.values()) == 2 and "realtime" not in rep.classes


def test_per_tenant_class_figures_match_the_records():
    trace = [TraceRequest(i * 0.1, "ab"[i % 2], list(RequestClass)[i % 3], 100 + i, 10 + i)
             for i in range(30)]
    rep = simulate(trace, "fsched", weights={"a": 3, "b": 1}, config=CFG)
    for tenant, classes in rep.tenant_classes.items():
        for request_class, stats in classes.items():
            mine = [r for r in rep.records if r.tenant == tenant and r.request_class.value == request_class]
            assert stats.count == len(mine)
            assert stats.ttft_p99_s == pytest.approx(max(r.first_token_s - r.arrival_s for r in mine),
                                                     rel=0.05)


def test_simulate_command_table_and_errors(small_trace):
    from fsched.cli.main import app

    runner = CliRunner()
    ok = runner.invoke(app, ["simulate", str(small_trace), "--policy", "vtc", "--policy", "priority"])
    assert ok.exit_code == 0 and "Jain index" in ok.stdout and "priority" in ok.stdout
    for args, message in (
        (["--policy", "lottery"], "unknown policy"),
        (["--tenants", "a=0"], "weights must be > 0"),
        (["--mix", "vip=1"], "unknown class"),
        (["--rate-scale", "0"], "--rate-scale"),
        (["--max-batch", "0"], "--max-batch"),
    ):
        res = runner.invoke(app, ["simulate", str(small_trace), *args])
        assert res.exit_code == 2, (args, res.output)
        assert message in res.stderr
    missing = runner.invoke(app, ["simulate", str(small_trace.parent / "nope.csv")])
    assert missing.exit_code == 2 and "nope.csv" in missing.stderr


def test_simulate_says_what_rows_of_a_public_trace_it_skipped(tmp_path):
    from fsched.cli.main import app

    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n7,ChatGPT,0,20,20,Conversation log\n"
                     "45,GPT-4,1087,230,1317,Conversation log\n120,GPT-4,300,0,300,API log\n")
    result = CliRunner().invoke(app, ["simulate", str(burst), "--policy", "fsched", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == 2
    assert result.stderr == f"fsched: note: {burst}: 2 rows with no prompt or no output tokens skipped\n"


def test_progress_counts_the_requests_settled_up_to_all_of_them(monkeypatch):
    import fsched.core.sim.simulator as simulator

    monkeypatch.setattr(simulator, "PROGRESS_EVERY", 2)
    cfg = SchedulerConfig(max_batch=2, kv_tokens=2_000, step_tokens=600, min_quantum_steps=2)
    trace = [TraceRequest(i * 0.05, "ab"[i % 2], RequestClass.BATCH, 100, 20) for i in range(12)]
    trace.insert(3, TraceRequest(0.12, "a", RequestClass.REALTIME, 5_000, 20))  # refused: settled too
    heard: list[int] = []
    report = simulator.simulate(trace, "fsched", config=cfg, progress=heard.append)
    assert report.rejected == 1
    assert len(heard) > 3 and heard == sorted(heard) and heard[0] < len(trace)
    assert heard[-1] == len(trace)


def test_simulate_shows_progress_on_a_terminal_only(small_trace):
    """A bar a policy on stderr when it is a terminal; stdout's JSON the same either way."""
    from fsched.cli.main import app

    args = ["simulate", str(small_trace), "--policy", "fcfs", "--policy", "fsched", "--json"]
    plain = CliRunner().invoke(app, args)
    shown = CliRunner().invoke(app, args, env={"TTY_COMPATIBLE": "1"})
    assert plain.exit_code == 0 and shown.exit_code == 0, shown.output
    assert plain.stderr == ""
    assert "fcfs" in shown.stderr and "fsched" in shown.stderr and "120/120 requests" in shown.stderr
    assert json.loads(shown.stdout)["requests"] == json.loads(plain.stdout)["requests"] == 120


@pytest.mark.parametrize("policy", ["priority", "fsched"])
def test_minimum_quantum_expiry_is_a_decision_point(policy):
    """A realtime request arrives while every running batch request is still
    inside its minimum quantum: the skip must stop when the quantum ends."""
    cfg = SchedulerConfig(max_batch=2, kv_tokens=20_000, step_tokens=600, min_quantum_steps=20)
    trace = [
        TraceRequest(0.0, "a", RequestClass.BATCH, 100, 2_000),
        TraceRequest(0.0, "a", RequestClass.BATCH, 100, 2_000),
        TraceRequest(0.05, "a", RequestClass.REALTIME, 50, 5),
    ]
    fast = simulate(trace, policy, config=cfg)
    slow = simulate(trace, policy, config=cfg, jump=False)
    assert fast.records[2].first_token_s == pytest.approx(slow.records[2].first_token_s)
    assert fast.records[2].first_token_s < 2.0  # ~20 steps, not the 2,000 of a batch request
