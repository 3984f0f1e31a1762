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
