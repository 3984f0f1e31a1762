"""bench/policy_matrix.py's A/B (--save, --compare): a saved report reads back as the checks read it, and
each compared goal is marked by the way its verdict moved."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from fsched.core.sched.accounting import WorkTally
from fsched.core.sim.report import ClassStats, PolicyReport, TenantStats

PATH = Path(__file__).resolve().parents[2] / "bench" / "policy_matrix.py"
spec = importlib.util.spec_from_file_location("bench_policy_matrix", PATH)
pm = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = pm  # its dataclasses look their module up there
spec.loader.exec_module(pm)


def _report(policy: str, on_target: float, p99: float, share: float) -> PolicyReport:
    stats = ClassStats(count=100, ttft_p50_s=0.1, ttft_p99_s=p99, tpot_p50_s=0.01, tpot_p99_s=0.02,
                       jct_p50_s=1.0, jct_p99_s=2.0, max_wait_s=3.0, on_target=on_target, goodput_per_s=0.5)
    return PolicyReport(policy=policy, classes={"realtime": stats}, throughput_tok_s=1000.0,
                        tenants={"a": TenantStats(3.0, 0.75, share), "b": TenantStats(1.0, 0.25, 1 - share)},
                        jain_index=0.9, max_wait_s=3.0, makespan_s=600.0, preemptions=7,
                        work=WorkTally(1000, 10, 20), rejected=1, backlogged_s=120.0)


def test_a_saved_report_reads_back_as_the_checks_read_it():
    by = {p: _report(p, 0.5 + i / 10, 1.0 + i, 0.7) for i, p in enumerate(pm.POLICIES)}
    back = {p: pm.report_of(json.loads(json.dumps(pm.report_json(r)))) for p, r in by.items()}
    s = pm.Scenario("5/15/80", "mooncake", 1.5, 7)
    ceilings = {"realtime": 1.0, "streaming": 1.0, "batch": 1.0}
    expected = [(c.goal, c.value, c.ok, c.ceiling) for c in pm.checks(s, by, ceilings)]
    assert [(c.goal, c.value, c.ok, c.ceiling) for c in pm.checks(s, back, ceilings)] == expected
    assert back["fsched"].work.preemption_cost == by["fsched"].work.preemption_cost


def test_compared_marks_each_goal_by_the_way_its_verdict_moved():
    old = [pm.Check("x", 1.0, 1.05, False), pm.Check("y", 1.2, 1.25, True), pm.Check("z", 0.0, -0.005, None)]
    new = [pm.Check("x", 1.06, 1.05, True), pm.Check("y", 1.3, 1.25, False), pm.Check("z", 0.0, -0.005, None)]
    line, moved = pm.compared("cell", old, new)
    assert moved
    assert "+x 1.000 FAIL -> 1.060 PASS" in line and "-y 1.200 PASS -> 1.300 FAIL" in line
    assert " z 0.000 NOT JUDGED -> 0.000 NOT JUDGED" in line
    assert pm.compared("cell", old, old)[1] is False
