"""bench/online_path.py's goal column: each row held to its own bounds (idle, under a full batch, in
front of vLLM), met at a bound, missed past it, each miss named with its figure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # online_path imports its sibling fast_path
spec = importlib.util.spec_from_file_location("bench_online_path", BENCH / "online_path.py")
op = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = op
spec.loader.exec_module(op)


def _row(loaded: bool = False, ratio: float = 1.0, p50: float = 0.0, p99: float = 0.0, **extra) -> dict:
    return {"backend": "sqlite", "replicas": 1, "loaded": loaded, "concurrency": 32, "ratio": ratio,
            "ttft_p50_extra_ms": p50, "ttft_p99_extra_ms": p99,
            "us_per_token": {"daemon": 20.0, "serve0": 15.0},
            "direct": {"tok_s": 1575.0, "ttft_p50_ms": 38.0, "ttft_p99_ms": 39.0},
            "fsched": {"tok_s": 1575.0 * ratio, "ttft_p50_ms": 38.0 + p50, "ttft_p99_ms": 39.0 + p99},
            **extra}


def test_an_idle_row_is_met_at_its_bounds_and_missed_past_each():
    assert op.goal_misses(_row(ratio=0.95, p50=15.0, p99=40.0)) == []
    assert op.goal_misses(_row(ratio=0.949)) == ["tok/s 0.949x < 0.95x"]
    assert op.goal_misses(_row(p50=15.1)) == ["TTFT p50 +15.1 > +15 ms"]
    assert op.goal_misses(_row(p99=40.1)) == ["TTFT p99 +40.1 > +40 ms"]
    assert len(op.goal_misses(_row(ratio=0.5, p50=20.0, p99=50.0))) == 3


def test_a_row_under_a_full_batch_is_held_to_its_first_token_alone():
    assert op.goal_misses(_row(loaded=True, ratio=0.5, p50=40.0, p99=100.0)) == []
    assert op.goal_misses(_row(loaded=True, p50=40.5, p99=100.5)) == ["TTFT p50 +40.5 > +40 ms",
                                                                       "TTFT p99 +100.5 > +100 ms"]


def test_a_row_in_front_of_vllm_is_held_to_its_ratios():
    assert op.goal_misses(_row(engine="vllm", ratio=0.9, p50=60.0, p99=90.0, ttft_p50_ratio=1.2)) == []
    assert op.goal_misses(_row(engine="vllm", ratio=0.85, ttft_p50_ratio=1.3)) == [
        "tok/s 0.85x < 0.9x", "TTFT p50 1.30x > 1.2x"]


def test_the_table_ends_each_row_with_its_verdict():
    lines = op.table_lines([_row(), _row(p50=20.0)])
    assert lines[0].endswith(" goal |") and lines[1].count("|") == lines[0].count("|")
    assert lines[2].endswith("| met |")
    assert lines[3].endswith("| TTFT p50 +20.0 > +15 ms |")


def _ended(read: float, written: float) -> dict:
    return {"end_read": read, "end_pushed": read + 0.001, "end_written": written}


def _next(arrived: float, opened: float) -> dict:
    return {"arrived": arrived, "committed": arrived + 0.002, "opened": opened}


def test_the_burst_table_follows_the_largest_burst_of_ends_to_the_next_requests_at_the_engine():
    # Two ends read together at 10.000 s (a burst), one alone 50 ms later; the requests that arrived from
    # the burst's first end written until the next burst's first end: two, then one after the window.
    jobs = [_ended(10.000, 10.004), _ended(10.002, 10.008), _ended(10.050, 10.053),
            _next(10.003, 10.020), _next(10.010, 10.030), _next(10.012, 10.032), _next(10.060, 10.070)]
    burst = op.burst_timeline(jobs)
    assert (burst["ends"], burst["next"]) == (2, 2)  # the request arrived at 10.003 came before any end
    timeline = burst["ms first/p50/last"]
    assert timeline["end_written"] == "4.0/6.0/8.0"
    assert timeline["arrived"] == "10.0/11.0/12.0"
    assert timeline["opened"] == "30.0/31.0/32.0"
    assert "claimed" not in timeline  # a stage no request reached is left out
    line = op.burst_lines([{"backend": "sqlite", "concurrency": 128, "stages": {"burst": burst}}])[-1]
    assert line.startswith("| sqlite | 128 | 2, 2 | 1.0/2.0/3.0 |  | 4.0/6.0/8.0 | 10.0/11.0/12.0 |")


def test_a_run_without_ends_has_no_burst():
    assert op.burst_timeline([_next(1.0, 1.01)]) == {}
    assert op.burst_lines([{"backend": "sqlite", "concurrency": 1, "stages": {"burst": {}}}])[2:] == []
