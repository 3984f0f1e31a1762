"""`fsched simulate --plot`: the figures over time are the simulator's, and the files stand alone."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from fsched.cli.main import app
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sim.plotdata import latency_cdf, plot_data
from fsched.core.sim.simulator import simulate
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass


def trace(n: int = 300, gap_s: float = 0.02) -> list[TraceRequest]:
    classes = [RequestClass.REALTIME, RequestClass.BATCH, RequestClass.BATCH]
    return [TraceRequest(i * gap_s, ("a", "b")[i % 2], classes[i % 3], 64, 48) for i in range(n)]


@pytest.fixture(scope="module")
def reports():
    config = SchedulerConfig(max_batch=8)
    return [simulate(trace(), p, weights={"a": 3, "b": 1}, config=config) for p in ("fcfs", "fsched")], config


def test_latency_cdf_is_monotone_ends_at_one_and_is_bounded_in_points():
    xs, ys = latency_cdf([0.5, 0.1, 0.3, 0.0])
    assert xs == sorted(xs) and xs[0] == 1e-3 and ys == [0.25, 0.5, 0.75, 1.0]
    xs, ys = latency_cdf([i / 1000 for i in range(10_000)], points=50)
    assert len(xs) == 50 and ys[-1] == 1.0 and ys == sorted(ys)
    assert latency_cdf([]) == ([], [])


def test_timeline_agrees_with_the_run(reports):
    (fcfs, fsched), config = reports
    for report in (fcfs, fsched):
        timeline = report.timeline
        assert timeline.times()[-1] >= report.makespan_s - timeline.bin_s
        waiting = [sum(b.waiting.values()) for b in timeline.bins]
        assert max(waiting) > 0 and waiting[-1] == 0  # the queue built up, and drained
        assert max(timeline.running()) <= config.max_batch and timeline.running()[-1] == 0
        shares = timeline.served_shares(["a", "b"], config.kv_tokens)
        for a, b in zip(shares["a"], shares["b"], strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert a + b == pytest.approx(1.0)
        # The charges the bins hold are the run's: the total GPU time is the busy time.
        total_gpu = sum(u[0] for bin_ in timeline.bins for u in bin_.usage.values())
        assert total_gpu == pytest.approx(report.busy_s, rel=1e-6)
    # Both tenants backlogged: fsched holds a near its 3:1 entitlement, fcfs does not.
    def middle_share(report):
        shares = report.timeline.served_shares(["a", "b"], config.kv_tokens)["a"]
        series = [v for v in shares if v is not None]
        middle = series[len(series) // 4: len(series) // 2]
        return sum(middle) / len(middle)

    assert middle_share(fsched) == pytest.approx(0.75, abs=0.08)
    assert middle_share(fcfs) < 0.65


def test_entitled_share_over_time_follows_the_tenants_with_work(reports):
    (_, fsched), _ = reports
    entitled = fsched.timeline.entitled_shares({"a": 3, "b": 1})
    both = [(a, b) for a, b in zip(entitled["a"], entitled["b"], strict=True)
            if a is not None and b is not None]
    assert both and all(a == pytest.approx(0.75) and b == pytest.approx(0.25) for a, b in both)


def test_plot_data_is_json_with_every_figure(reports):
    (fcfs, fsched), config = reports
    data = json.loads(json.dumps(plot_data("t", [fcfs, fsched], config.kv_tokens)))
    assert [p["policy"] for p in data["policies"]] == ["fcfs", "fsched"]
    p = data["policies"][1]
    assert set(p["cdf"]) == {"realtime", "batch"} and p["cdf"]["batch"]["y"][-1] == 1.0
    n = len(p["time"])
    assert n > 50 and all(len(s) == n for s in [*p["shares"].values(), *p["waiting"].values(), p["running"]])


def test_simulate_writes_a_self_contained_html_plot(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": i / 20, "prompt_tokens": 32, "output_tokens": 16,
                                        "tenant": "ab"[i % 2]}) + "\n" for i in range(120)))
    out = tmp_path / "plot.html"
    result = CliRunner().invoke(app, ["simulate", str(path), "--policy", "fcfs", "--policy", "fsched",
                                      "--tenants", "a=3,b=1", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "uPlot" in page and "window.FSCHED_PLOT = " in page and "MIT" in page
    assert not re.search(r"<(script|link)[^>]+(src|href)=", page)  # nothing loaded from elsewhere
    data = json.loads(page.split("window.FSCHED_PLOT = ", 1)[1].split(";</script>", 1)[0])
    assert [p["policy"] for p in data["policies"]] == ["fcfs", "fsched"]


def test_plot_refuses_an_unknown_suffix_before_simulating(tmp_path):
    result = CliRunner().invoke(app, ["simulate", str(tmp_path / "missing.jsonl"),
                                      "--plot", str(tmp_path / "x.svg")])
    assert result.exit_code == 2 and "must end in .html or .png" in result.output


def test_png_plot_with_matplotlib(tmp_path, reports):
    pytest.importorskip("matplotlib", reason="matplotlib is the optional plot extra")
    from fsched.cli.plot import write_plot

    (fcfs, fsched), config = reports
    out = tmp_path / "plot.png"
    write_plot(out, plot_data("t", [fcfs, fsched], config.kv_tokens))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
