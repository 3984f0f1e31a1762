"""`fsched replay`: send a trace to an OpenAI-compatible endpoint, live, and report it as `simulate` does.

Thin: parse the flags, read the trace exactly as `fsched simulate` reads it
(the same tenants, classes and times for the same flags), call
`fsched.core.replay`, print the simulator's table (or JSON).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fsched.cli.common import fail, read_trace
from fsched.cli.simulate import _DEFAULT_MIX_TEXT, _Limit, _Mix, _RateScale, _Seed, _Trace, comparison_table
from fsched.core.sim.trace import TraceError, parse_assignments, parse_mix

if TYPE_CHECKING:
    from fsched.core.replay.driver import Observed
    from fsched.core.replay.http import ServerAddress
    from fsched.core.replay.plan import Send
    from fsched.core.replay.report import LiveRun

_Url = Annotated[str, typer.Option("--url", show_default=False,
                                   help="The endpoint: http://HOST:PORT of fsched serve, vLLM or any "
                                   "OpenAI-compatible server.")]
_Key = Annotated[list[str], typer.Option(
    "--key", metavar="TENANT=KEY", show_default=False,
    help="A tenant's API key; repeat, one per tenant (TENANT= sends none).")]
_Tenants = Annotated[str | None, typer.Option(
    "--tenants", metavar="NAME=W,...", show_default=False,
    help="Tenant weights, as simulate takes them (default: the --key tenants, weight 1 each).")]
_Duration = Annotated[float | None, typer.Option(
    "--duration", metavar="S", show_default=False,
    help="Send only the requests arriving in the first S seconds.")]
_Model = Annotated[str | None, typer.Option("--model", show_default=False,
                                            help="Model to ask for (default: the first the endpoint lists).")]
_Endpoint = Annotated[str, typer.Option("--endpoint", metavar="chat|completions",
                                        help="Streamed chat completions or completions.")]
_Label = Annotated[str | None, typer.Option("--label", show_default=False,
                                            help="The run's name in the table (default: the URL).")]
_Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts (per tenant and class too).")]
_Records = Annotated[Path | None, typer.Option(
    "--records", metavar="FILE", show_default=False,
    help="Also write each request as measured, one JSON line each, in trace order.")]


def replay(
    trace: _Trace,
    url: _Url,
    key: _Key,
    tenants: _Tenants = None,
    mix: _Mix = _DEFAULT_MIX_TEXT,
    rate_scale: _RateScale = 1.0,
    limit: _Limit = None,
    duration: _Duration = None,
    model: _Model = None,
    endpoint: _Endpoint = "chat",
    seed: _Seed = 0,
    label: _Label = None,
    json_out: _Json = False,
    records: _Records = None,
) -> None:
    """Send a request trace to an endpoint at its own times (scaled) and report it as simulate does."""
    from fsched.core.replay.driver import raise_open_files_limit
    from fsched.core.replay.http import ServerAddress
    from fsched.core.replay.plan import send_plan

    try:
        keys, weights = _keys_and_weights(key, tenants)
        if endpoint not in ("chat", "completions"):
            raise ValueError(f"--endpoint must be chat or completions, got {endpoint!r}")
        if not rate_scale > 0:
            raise ValueError("--rate-scale must be > 0")
        if limit is not None and limit < 1:
            raise ValueError("--limit must be >= 1")
        requests = read_trace(trace, tenants=sorted(weights), mix=parse_mix(mix), rate_scale=rate_scale,
                              limit=limit, seed=seed)
        unkeyed = sorted({r.tenant for r in requests} - set(keys))
        if unkeyed:
            raise ValueError(f"--key: the trace has work of tenant {unkeyed[0]!r}: give its key")
        sends = send_plan(requests, duration)
        target = ServerAddress.parse(url)
    except (TraceError, ValueError) as exc:
        fail(str(exc), 2)
    raise_open_files_limit()
    run, observed = _run(target, keys, weights, sends, model, endpoint == "chat", seed, label or target.url)
    if records is not None:
        from fsched.core.replay.report import observed_json

        records.write_text("".join(json.dumps(observed_json(o)) + "\n" for o in observed))
    if json_out:
        print(json.dumps({"trace": str(trace), "requests": len(sends), **run.to_json()}, indent=2))
        return
    from rich.console import Console

    Console().print(replay_table(str(trace), run))


def _keys_and_weights(key: list[str], tenants: str | None) -> tuple[dict[str, str], dict[str, float]]:
    keys: dict[str, str] = {}
    for item in key:
        tenant, sep, secret = item.partition("=")
        if not sep or not tenant.strip():
            raise ValueError(f"--key: expected TENANT=KEY, got {item!r}")
        if tenant.strip() in keys:
            raise ValueError(f"--key: tenant {tenant.strip()!r} given twice")
        keys[tenant.strip()] = secret.strip()
    if tenants is None:
        return keys, {t: 1.0 for t in keys}
    weights = parse_assignments(tenants, "--tenants")
    if any(w <= 0 for w in weights.values()):
        raise ValueError("--tenants: weights must be > 0")
    missing, extra = sorted(set(weights) - set(keys)), sorted(set(keys) - set(weights))
    if missing:
        raise ValueError(f"--key: no key for tenant {missing[0]!r}")
    if extra:
        raise ValueError(f"--key: tenant {extra[0]!r} is not in --tenants")
    return keys, weights


def _run(target: ServerAddress, keys: dict[str, str], weights: dict[str, float], sends: list[Send],
         model: str | None, chat: bool, seed: int, label: str) -> tuple[LiveRun, list[Observed]]:
    from fsched.cli.progress import StderrProgress
    from fsched.core.replay.driver import ReplayError, connect
    from fsched.core.replay.driver import replay as send_all
    from fsched.core.replay.report import live_report

    async def both(on_progress):
        found = await connect(target, keys, model, chat, seed)
        return found, await send_all(found, sends, on_progress)

    try:
        with StderrProgress() as bar:  # while requests are out (none when stderr is no terminal)
            task = bar.add("replay", len(sends))

            def on_progress(p) -> None:
                bar.update(task, p.done, f"sent {p.sent:,}/{p.total:,}  done {p.done:,}  "
                                         f"failed {p.failed:,}  tokens {p.tokens:,}")

            found, observed = asyncio.run(both(on_progress))
    except ReplayError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted: no report (the requests already sent may still run at the endpoint)", 130)
    return live_report(label, observed, weights, url=target.url, model=found.model,
                       prompt_sizing=found.shape.describe(), forcing=found.forcing.describe()), observed


def replay_table(trace: str, run: LiveRun):
    """The simulator's table for the live run, then what only a live run has (pure)."""
    table = comparison_table(trace, run.sent, [run.report], kind=f"live, {run.model}")
    table.add_row("completed / sent", f"{run.completed:,} / {run.sent:,}")
    table.add_row("refused (HTTP 400) / failed", f"{run.refused:,} / {run.failed:,}")
    for message, count in run.errors.items():
        table.add_row(f"  {count:,} x", message)
    table.add_row("prompts", run.prompt_sizing)
    if run.prompt_error is not None:
        table.add_row("prompt tokens off by (mean)", f"{100 * run.prompt_error:.1f}%")
    early = f"; {run.short_outputs:,} ended early" if run.short_outputs else ""
    table.add_row("outputs", run.forcing + early)
    table.add_row("latest send behind schedule", f"{1000 * run.send_lag_max_s:.0f} ms")
    table.add_row("shares over (every tenant outstanding)", f"{run.share_window_s:.1f} s")
    return table
