"""`fsched simulate`: replay a trace through the scheduler under several policies.

Thin: parse the flags, call `fsched.core.sim.simulator`, print. Imports stay
light (no torch, no SQLAlchemy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fsched.cli.common import fail, read_trace
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.policy import POLICIES
from fsched.core.sim.costmodel import DEFAULT_PROFILE, PROFILES
from fsched.core.sim.simulator import PolicyReport
from fsched.core.sim.simulator import simulate as run_simulation
from fsched.core.sim.trace import DEFAULT_MIX, TraceError, parse_assignments, parse_mix

_DEFAULT_MIX_TEXT = ",".join(f"{c.value}={p:g}" for c, p in DEFAULT_MIX.items())


_Trace = Annotated[
    Path,
    typer.Argument(help="Azure LLM trace or BurstGPT CSV, Mooncake JSONL or fsched JSONL trace.",
                   show_default=False),
]
_Policy = Annotated[
    list[str] | None,
    typer.Option("--policy", metavar="POLICY", show_default=False,
                 help=f"Policy to run; repeat to compare ({', '.join(POLICIES)}). Default: fsched."),
]
_Tenants = Annotated[str, typer.Option("--tenants", metavar="NAME=W,...", help="Tenant weights (W > 0).")]
_Mix = Annotated[
    str,
    typer.Option("--mix", metavar="CLASS=P,...", help="Class probabilities for requests without a class."),
]
_RateScale = Annotated[
    float, typer.Option("--rate-scale", help="Multiply the arrival rate (divide times) by X.")
]
_Limit = Annotated[int | None, typer.Option("--limit", help="Read only the first N requests.")]
_Seed = Annotated[int, typer.Option("--seed", help="Seed for tenant/class assignment.")]
_MaxBatch = Annotated[
    int | None, typer.Option("--max-batch", help="Requests in the running batch.", show_default=False)
]
_KvTokens = Annotated[
    int | None, typer.Option("--kv-tokens", help="KV cache budget in token slots.", show_default=False)
]
_CostModel = Annotated[
    str,
    typer.Option("--cost-model", help="Engine to simulate: tiny-cpu (fitted to fsched's engine on "
                 "the built-in model, CPU), h100-8b (an ~8B model on one H100-class GPU) or paced (the "
                 "paced stand-in engine, 20 ms a step; its slots are --max-batch)."),
]
_Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts (per tenant and class too).")]
_Plot = Annotated[
    Path | None,
    typer.Option("--plot", metavar="FILE", show_default=False,
                 help="Also draw each policy's first-token CDF by class, served share over time per tenant "
                 "and queue depth over time: FILE.html (self-contained, works offline) or FILE.png "
                 "(needs the plot extra: matplotlib)."),
]


def simulate(
    trace: _Trace,
    policy: _Policy = None,
    tenants: _Tenants = "default=1",
    mix: _Mix = _DEFAULT_MIX_TEXT,
    rate_scale: _RateScale = 1.0,
    limit: _Limit = None,
    seed: _Seed = 0,
    max_batch: _MaxBatch = None,
    kv_tokens: _KvTokens = None,
    cost_model: _CostModel = DEFAULT_PROFILE,
    json_out: _Json = False,
    plot: _Plot = None,
) -> None:
    """Replay a request trace through the scheduler against the engine cost model."""
    if plot is not None:
        _check_plot(plot)
    policies = list(policy or ["fsched"])
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        fail(f"--policy: unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})", 2)
    if len(set(policies)) != len(policies):
        fail("--policy: a policy is given twice", 2)
    try:
        weights = parse_assignments(tenants, "--tenants")
        if any(w <= 0 for w in weights.values()):
            raise ValueError("--tenants: weights must be > 0")
        classes = parse_mix(mix)
        if not rate_scale > 0:
            raise ValueError("--rate-scale must be > 0")
        if limit is not None and limit < 1:
            raise ValueError("--limit must be >= 1")
        config = _config(max_batch, kv_tokens)
        requests = read_trace(trace, tenants=sorted(weights), mix=classes, rate_scale=rate_scale, limit=limit,
                              seed=seed)
        if cost_model not in PROFILES:
            raise ValueError(f"--cost-model must be one of {', '.join(PROFILES)}, got {cost_model!r}")
        cost = PROFILES[cost_model]
        reports = _simulated(requests, policies, weights, config, cost)
    except (TraceError, ValueError) as exc:
        fail(str(exc), 2)
    if plot is not None:
        _write_plot(plot, f"{trace.name}: {len(requests):,} requests, simulated ({cost_model})", reports,
                    config.kv_tokens)
    if json_out:
        doc = {"trace": str(trace), "cost_model": cost_model, "requests": len(requests),
               "policies": {r.policy: r.to_json() for r in reports}}
        print(json.dumps(doc, indent=2))
        return
    from rich.console import Console

    Console().print(comparison_table(str(trace), len(requests), reports))


def _simulated(requests, policies: list[str], weights: dict[str, float], config: SchedulerConfig,
               cost) -> list[PolicyReport]:
    """Each policy's run, with a bar a policy on stderr while they run (none when stderr is no terminal)."""
    from fsched.cli.progress import StderrProgress

    total = len(requests)
    reports = []
    with StderrProgress() as bar:
        for name in policies:
            task = bar.add(name, total)

            def settled(n: int, task=task) -> None:
                bar.update(task, n, f"{n:,}/{total:,} requests")

            reports.append(run_simulation(requests, name, weights=weights, config=config, cost=cost,
                                          progress=settled))
    return reports


def _check_plot(path: Path) -> None:
    from fsched.cli.common import UserError
    from fsched.cli.plot import check_plot_path

    try:
        check_plot_path(path)
    except UserError as exc:
        fail(str(exc), 2)


def _write_plot(path: Path, title: str, reports: list[PolicyReport], kv_tokens: int) -> None:
    import sys

    from fsched.cli.plot import write_plot
    from fsched.core.sim.plotdata import plot_data

    write_plot(path, plot_data(title, reports, kv_tokens))
    print(f"plot written to {path}", file=sys.stderr)


def _config(max_batch: int | None, kv_tokens: int | None) -> SchedulerConfig:
    overrides = {}
    if max_batch is not None:
        overrides["max_batch"] = max_batch
    if kv_tokens is not None:
        overrides["kv_tokens"] = kv_tokens
    try:
        return SchedulerConfig(**overrides)
    except ValueError as exc:
        raise ValueError(f"--max-batch/--kv-tokens: {exc}") from None


def _fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.3f}" if unit == "x" else f"{value:,.0f}"


def comparison_table(trace: str, n: int, reports: list[PolicyReport], kind: str = "simulated"):
    """A rich Table: one column per policy, one row per metric (pure). A measured run (`kind`, e.g. a
    replay's) has no preemption or backfill counts: a client cannot see them."""
    from rich.table import Table

    table = Table(title=f"{trace}: {n} requests ({kind})")
    table.add_column("metric")
    for r in reports:
        table.add_column(r.policy, justify="right")
    classes = [c for c in ("realtime", "streaming", "batch") if any(c in r.classes for r in reports)]
    for request_class in classes:
        for key, label in (
            ("ttft_p50_s", "TTFT p50"),
            ("ttft_p99_s", "TTFT p99"),
            ("tpot_p50_s", "TPOT p50"),
            ("tpot_p99_s", "TPOT p99"),
            ("jct_p50_s", "JCT p50"),
            ("jct_p99_s", "JCT p99"),
            ("max_wait_s", "max wait"),
        ):
            cells = [_fmt(getattr(r.classes[request_class], key)) if request_class in r.classes else "-"
                     for r in reports]
            table.add_row(f"{request_class} {label}", *cells)
        for key, label, fmt in (("on_target", "on target", "{:.3f}"),
                                ("goodput_per_s", "goodput (on target/s)", "{:.3g}")):
            cells = [fmt.format(getattr(r.classes[request_class], key)) if request_class in r.classes else "-"
                     for r in reports]
            table.add_row(f"{request_class} {label}", *cells)
    tenants = sorted({t for r in reports for t in r.tenants})
    for t in tenants:
        cells = []
        for r in reports:
            s = r.tenants.get(t)
            cells.append("-" if s is None else f"{s.share:.3f} / {s.entitled:.3f}")
        table.add_row(f"tenant {t} served over the run / entitled", *cells)
    table.add_row("Jain index", *[_fmt(r.jain_index, "x") for r in reports])
    table.add_row("throughput tok/s", *[_fmt(r.throughput_tok_s, "n") for r in reports])
    table.add_row("max wait", *[_fmt(r.max_wait_s) for r in reports])
    if kind == "simulated":
        table.add_row("preemptions", *[f"{r.preemptions:,}" for r in reports])
        table.add_row("preemption cost (recomputed + parked / computed)",
                      *[f"{100 * r.work.preemption_cost:.2f}%" for r in reports])
        table.add_row("backfilled", *[f"{r.backfilled:,}" for r in reports])
        table.add_row("refused (beyond the KV budget)", *[f"{r.rejected:,}" for r in reports])
    table.add_row("makespan", *[_fmt(r.makespan_s) for r in reports])
    return table
