"""Pure builders: a status snapshot in, rich renderables out."""

from __future__ import annotations

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fsched.cli.report import StatusSnapshot, daemon_alive, tenant_entitlements
from fsched.core.store import DaemonSummary, JobSummary, TenantSummary
from fsched.core.types import JobState

STATE_STYLES = {
    JobState.QUEUED: "yellow",
    JobState.IN_PROGRESS: "cyan",
    JobState.COMPLETED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLING: "magenta",
    JobState.CANCELLED: "dim",
}


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


def tenants_table(tenants: list[TenantSummary]) -> Table:
    entitled = tenant_entitlements(tenants)
    table = Table(title="Tenants", title_justify="left")
    for column, justify in [
        ("tenant", "left"),
        ("weight", "right"),
        ("entitled", "right"),
        ("active jobs", "right"),
        ("queued", "right"),
        ("running", "right"),
    ]:
        table.add_column(column, justify=justify, no_wrap=True)
    for tenant in tenants:
        active = tenant.queued or tenant.running
        table.add_row(
            tenant.name,
            f"{tenant.weight:g}",
            Text(f"{entitled[tenant.name]:.0%}", style="" if active else "dim"),
            str(tenant.active_jobs),
            f"{tenant.queued:,}",
            f"{tenant.running:,}",
        )
    return table


def daemons_table(daemons: list[DaemonSummary], now: float) -> Table:
    table = Table(title="Daemons", title_justify="left")
    for column in ("id", "host", "device", "model", "heartbeat", "state"):
        table.add_column(column, no_wrap=True)
    for daemon in daemons:
        alive = daemon_alive(daemon, now)
        table.add_row(
            daemon.id,
            daemon.host,
            daemon.device,
            daemon.model,
            f"{format_age(now - daemon.heartbeat_at)} ago",
            Text("alive", style="green") if alive else Text("dead", style="red"),
        )
    return table


def status_view(snapshot: StatusSnapshot) -> Group:
    parts = [jobs_table(snapshot.jobs, snapshot.now), tenants_table(snapshot.tenants)]
    if snapshot.daemons:
        parts.append(daemons_table(snapshot.daemons, snapshot.now))
    else:
        parts.append(Text("No daemon has run on this job table yet (start one: fsched daemon).", style="dim"))
    return Group(*parts)
