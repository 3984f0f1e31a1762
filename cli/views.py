"""Pure builders: a status snapshot in, rich renderables out."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fsched.cli.report import StatusSnapshot, tenant_entitlements
from fsched.core.jobs.jobstate import JobSummary
from fsched.core.ports.records import DaemonSummary, TenantSummary, newest_live_daemon
from fsched.core.sched.explain import RequestStanding
from fsched.core.types import JobState, RequestState

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
    """The live daemon's engine figures (from its heartbeat)."""
    s = daemon.stats
    kv_pct = f" ({s.kv_tokens / s.kv_budget:.0%})" if s.kv_budget else ""
    lines = [
        f"[bold]model[/] {daemon.model}   [bold]device[/] {daemon.device}   "
        f"[bold]policy[/] {s.policy or '?'}   [bold]daemon[/] {daemon.id} (pid {daemon.pid})",
        f"[bold]batch[/] {s.batch}   [bold]running[/] {s.running}   "
        f"[bold]waiting[/] {s.waiting}   [bold]held[/] {s.held}   "
        f"[bold]KV[/] {s.kv_tokens:,}/{s.kv_budget:,} tokens{kv_pct}",
        f"[bold]tok/s[/] {s.tok_s:,.1f}   [bold]step[/] {s.step_ms:.1f} ms   "
        f"[bold]steps[/] {s.steps:,}   [bold]tokens[/] {s.tokens:,}   "
        f"[bold]heartbeat[/] {daemon.heartbeat_age(now):.1f}s ago",
    ]
    return Panel("\n".join(lines), title="Daemon", title_align="left", expand=False)


def why_table(requests: tuple[RequestStanding, ...] | list[RequestStanding]) -> Table:
    """Why each running or waiting request runs or waits, in the scheduler's order (as Slurm's sprio):
    class, tier (precedence or share), base priority, wait, whether it is late, tenant's DRF share."""
    table = Table(title="Why (running, then waiting in admission order)", title_justify="left")
    for column, justify in [
        ("req", "right"), ("tenant", "left"), ("class", "left"), ("state", "left"), ("tier", "left"),
        ("pri", "right"), ("waited", "right"), ("late", "left"), ("generated", "right"),
        ("tenant share", "right"),
    ]:
        table.add_column(column, justify=justify, no_wrap=True)
    for r in requests:
        running = r.state is RequestState.RUNNING
        table.add_row(
            r.id,
            r.tenant,
            r.request_class.value,
            Text(r.state.value, style="cyan" if running else "yellow"),
            r.tier,
            str(r.priority),
            f"{r.waited_s:.1f}s",
            Text("late", style="red") if r.late else "",
            f"{r.generated:,}",
            f"{r.tenant_share:.3f}",
        )
    if not requests:
        table.add_row("", Text("nothing running or waiting", style="dim"), *[""] * 8)
    return table


def daemons_table(daemons: list[DaemonSummary], now: float) -> Table:
    table = Table(title="Daemons", title_justify="left")
    for column, justify in [("daemon", "left"), ("host", "left"), ("device", "left"), ("heartbeat", "right"),
                            ("batch", "right"), ("tokens/s", "right"), ("state", "left")]:
        table.add_column(column, justify=justify, no_wrap=True)
    styles = {"alive": "green", "stopped": "dim", "dead": "red"}
    for daemon in daemons:
        state = daemon.state(now)
        alive = state == "alive"  # a dead or stopped daemon's last figures are not shown as current
        table.add_row(
            daemon.id,
            daemon.host,
            daemon.device,
            f"{format_age(daemon.heartbeat_age(now))} ago",
            str(daemon.stats.batch) if alive else "",
            f"{daemon.stats.tok_s:,.0f}" if alive else "",
            Text(state, style=styles[state]),
        )
    return table


def status_view(snapshot: StatusSnapshot) -> Group:
    live = newest_live_daemon(snapshot.daemons, snapshot.now)
    served = dict(live.stats.served_share) if live is not None else None
    parts = [jobs_table(snapshot.jobs, snapshot.now), tenants_table(snapshot.tenants, served)]
    if live is not None:
        parts += [daemon_panel(live, snapshot.now), why_table(live.stats.requests)]
    if snapshot.daemons:
        parts.append(daemons_table(snapshot.daemons, snapshot.now))
    else:
        parts.append(Text("No daemon has run on this job table yet (start one: fsched daemon).", style="dim"))
    return Group(*parts)
