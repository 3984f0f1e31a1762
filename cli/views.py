"""Pure builders: a status snapshot in, rich renderables out."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fsched.cli.report import (
    StatusSnapshot,
    daemon_state,
    heartbeat_age,
    live_daemon,
    tenant_entitlements,
)
from fsched.core.ports.records import DaemonSummary, JobSummary, TenantSummary
from fsched.core.types import JobState, RequestClass

STATE_STYLES = {
    JobState.QUEUED: "yellow",
    JobState.IN_PROGRESS: "cyan",
    JobState.COMPLETED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLING: "magenta",
    JobState.CANCELLED: "dim",
}
NO_SHARE = "\u2013"  # en dash: no tenant has work, so nobody is entitled to a share


def format_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def jobs_table(jobs: list[JobSummary], now: float) -> Table:
    table = Table(title="Jobs", title_justify="left")
    table.add_column("id", justify="right", no_wrap=True, min_width=2)
    table.add_column("name", max_width=24, overflow="ellipsis", no_wrap=True)
    table.add_column("tenant", no_wrap=True, min_width=6)
    table.add_column("class", no_wrap=True, min_width=8)
    table.add_column("pri", justify="right", no_wrap=True, min_width=3)
    table.add_column("state", no_wrap=True, min_width=11)
    table.add_column("progress", no_wrap=True, min_width=10)
    table.add_column("done", justify="right", no_wrap=True, min_width=5)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("age", justify="right", no_wrap=True, min_width=5)
    for job in jobs:
        c = job.counts
        table.add_row(
            str(job.id),
            job.name,
            job.tenant,
            job.request_class.value,
            str(job.priority),
            Text(job.state.value, style=STATE_STYLES[job.state]),
            ProgressBar(total=max(c.num_requests, 1), completed=c.num_finished, width=10),
            f"{c.num_done}/{c.num_requests}" + (f" ({c.num_failed} failed)" if c.num_failed else ""),
            f"{job.num_output_tokens:,}",
            format_age(now - job.submitted_at),
        )
    if not jobs:
        table.add_row("", Text("no jobs", style="dim"), *[""] * 8)
    return table


def tenants_table(tenants: list[TenantSummary], served: dict[str, float] | None = None) -> Table:
    """Tenants with their entitled share; with `served` (a live daemon's served_share), the
    dominant share each was recently served beside it."""
    entitled = tenant_entitlements(tenants)
    table = Table(title="Tenants", title_justify="left")
    columns = [("tenant", "left"), ("weight", "right"), ("entitled", "right")]
    if served is not None:
        columns.append(("served", "right"))
    columns += [("active jobs", "right"), ("queued", "right"), ("running", "right")]
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=True)
    for tenant in tenants:
        active = tenant.queued or tenant.running
        share = entitled[tenant.name]
        cells = [tenant.name, f"{tenant.weight:g}", Text(percent(share), style="" if active else "dim")]
        if served is not None:
            cells.append(served_cell(served.get(tenant.name, 0.0), share, bool(active)))
        cells += [str(tenant.active_jobs), f"{tenant.queued:,}", f"{tenant.running:,}"]
        table.add_row(*cells)
    return table


def percent(share: float | None) -> str:
    """A share as a whole percentage; a dash for none."""
    return NO_SHARE if share is None else f"{share:.0%}"


def served_cell(served: float, entitled: float | None, active: bool) -> Text:
    """Served dominant share; yellow when an active tenant is more than 5 points off its entitlement."""
    off = active and entitled is not None and abs(served - entitled) > 0.05
    return Text(f"{served:.0%}", style="yellow" if off else ("" if active else "dim"))


def daemon_panel(daemon: DaemonSummary, now: float) -> Panel:
    """The live daemon's engine figures (from its heartbeat stats)."""
    s = daemon.stats
    kv, budget = s.get("kv_tokens", 0), s.get("kv_budget", 0)
    kv_pct = f" ({kv / budget:.0%})" if budget else ""
    lines = [
        f"[bold]model[/] {daemon.model}   [bold]device[/] {daemon.device}   "
        f"[bold]policy[/] {s.get('policy', '?')}   [bold]daemon[/] {daemon.id} (pid {daemon.pid})",
        f"[bold]batch[/] {s.get('batch', 0)}   [bold]running[/] {s.get('running', 0)}   "
        f"[bold]waiting[/] {s.get('waiting', 0)}   [bold]held[/] {s.get('held', 0)}   "
        f"[bold]KV[/] {kv:,}/{budget:,} tokens{kv_pct}",
        f"[bold]tok/s[/] {s.get('tok_s', 0.0):,.1f}   [bold]step[/] {s.get('step_ms', 0.0):.1f} ms   "
        f"[bold]steps[/] {s.get('steps', 0):,}   [bold]tokens[/] {s.get('tokens', 0):,}   "
        f"[bold]heartbeat[/] {heartbeat_age(daemon, now):.1f}s ago",
    ]
    return Panel("\n".join(lines), title="Daemon", title_align="left", expand=False)


BAND_NAMES = {c.band: c.value for c in RequestClass}


def band_name(band: int) -> str:
    return BAND_NAMES.get(band, str(band))


def why_table(requests: list[dict]) -> Table:
    """Why each running or waiting request runs or waits, in the scheduler's order (as Slurm's sprio):
    class band and the band aging lifted it to, MLFQ level, base priority, wait, tenant's DRF share."""
    table = Table(title="Why (running, then waiting in admission order)", title_justify="left")
    for column, justify in [
        ("req", "right"), ("tenant", "left"), ("class", "left"), ("state", "left"),
        ("band → aged", "left"), ("age boost", "right"), ("level", "right"), ("pri", "right"),
        ("waited", "right"), ("generated", "right"), ("tenant share", "right"),
    ]:
        table.add_column(column, justify=justify, no_wrap=True)
    for r in requests:
        boost = r.get("age_boost", 0)
        table.add_row(
            str(r["id"]),
            r["tenant"],
            r["class"],
            Text(r["state"], style="cyan" if r["state"] == "running" else "yellow"),
            f"{band_name(r['band'])} → {band_name(r['aged_band'])}",
            f"+{boost}" if boost else "0",
            str(r["level"]),
            str(r["priority"]),
            f"{r['waited_s']:.1f}s",
            f"{r.get('generated', 0):,}",
            f"{r['tenant_share']:.3f}",
        )
    if not requests:
        table.add_row("", Text("nothing running or waiting", style="dim"), *[""] * 9)
    return table


def daemons_table(daemons: list[DaemonSummary], now: float) -> Table:
    table = Table(title="Daemons", title_justify="left")
    for column, justify in [("daemon", "left"), ("host", "left"), ("device", "left"), ("heartbeat", "right"),
                            ("batch", "right"), ("tokens/s", "right"), ("state", "left")]:
        table.add_column(column, justify=justify, no_wrap=True)
    styles = {"alive": "green", "stopped": "dim", "dead": "red"}
    for daemon in daemons:
        state = daemon_state(daemon, now)
        s = daemon.stats if state == "alive" else {}
        table.add_row(
            daemon.id,
            daemon.host,
            daemon.device,
            f"{format_age(heartbeat_age(daemon, now))} ago",
            str(s.get("batch", "")),
            f"{s['tok_s']:,.0f}" if "tok_s" in s else "",
            Text(state, style=styles[state]),
        )
    return table


def status_view(snapshot: StatusSnapshot) -> Group:
    live = live_daemon(snapshot.daemons, snapshot.now)
    served = live.stats.get("served_share", {}) if live is not None else None
    parts = [jobs_table(snapshot.jobs, snapshot.now), tenants_table(snapshot.tenants, served)]
    if live is not None:
        parts += [daemon_panel(live, snapshot.now), why_table(live.stats.get("requests", []))]
    if snapshot.daemons:
        parts.append(daemons_table(snapshot.daemons, snapshot.now))
    else:
        parts.append(Text("No daemon has run on this job table yet (start one: fsched daemon).", style="dim"))
    return Group(*parts)
