"""Pure builders: a status snapshot in, rich renderables out."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.text import Text

from fsched.cli.fit import Col, fitted_table, with_legend
from fsched.cli.report import StatusSnapshot, live_fairness, live_first_tokens, tenant_entitlements
from fsched.core.jobs.jobstate import JobSummary
from fsched.core.ports.records import DaemonSummary, OnlineGroup, TenantSummary, newest_live_daemon
from fsched.core.sched.explain import RequestStanding
from fsched.core.types import JobState, RequestClass, RequestStatus

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


WIDE = 10_000  # the width of a view with every column (--wide, and the builders' default)
# One word for each kind of share, everywhere: entitled, served recently (the daemon's decayed
# figure), served over the run (a demo's or a simulation's whole run).
SHARES_LEGEND = ("entitled: weight over the weights of tenants with work; served recently: decayed part "
                 "of compute or KV (newest daemon)")
SHARES_LEGEND_SHORT = "entitled: weight/weights with work; served recently: decayed use of compute/KV"


def jobs_table(jobs: list[JobSummary], now: float, width: int = WIDE, wide: bool = False) -> Group:
    """Submitted files and batches: unfinished ones, then the last finished."""
    cols = [Col("id", justify="right"), Col("name", shrink_to=8), Col("tenant"), Col("class"),
            Col("priority", "pri", drop=5, justify="right"), Col("state"), Col("progress", drop=3),
            Col("done", justify="right"), Col("tokens", drop=2, justify="right"),
            Col("age", drop=4, justify="right")]
    rows = []
    for job in jobs:
        c = job.counts
        rows.append([
            str(job.id), job.name, job.tenant, job.request_class.value, str(job.priority),
            Text(job.state.value, style=STATE_STYLES[job.state]),
            ProgressBar(total=max(c.num_requests, 1), completed=c.num_finished, width=10),
            f"{c.num_done}/{c.num_requests}" + (f" ({c.num_failed} failed)" if c.num_failed else ""),
            f"{job.num_output_tokens:,}", format_age(now - job.submitted_at),
        ])
    return with_legend(fitted_table("Jobs", cols, rows, width, wide, empty="no jobs"))


def online_table(groups: list[OnlineGroup], width: int = WIDE, wide: bool = False) -> Group:
    """Online requests (and `generate` prompts), one line per tenant and API key."""
    cols = [Col("tenant"), Col("key"), Col("requests", "reqs", justify="right"),
            Col("in flight", "now", justify="right"), Col("done", drop=3, justify="right"),
            Col("failed", drop=4, justify="right"), Col("cancelled", "canc", drop=5, justify="right"),
            Col("tokens", drop=2, justify="right"), Col("first token p50", "ttft p50", justify="right"),
            Col("p99", justify="right", drop=1)]
    rows = [[g.tenant, g.key_id or "(generate)", f"{g.requests:,}", f"{g.in_flight:,}", f"{g.done:,}",
             f"{g.failed:,}", f"{g.cancelled:,}", f"{g.generated_tokens:,}", seconds(g.ttft_p50_s),
             seconds(g.ttft_p99_s)] for g in groups]
    fitted = fitted_table("Online requests (per tenant and key; first token over the last 5 minutes)", cols,
                          rows, width, wide)
    return with_legend(fitted)


def seconds(value: float | None) -> str:
    if value is None:
        return NO_SHARE
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def tenants_table(tenants: list[TenantSummary], served: dict[str, float] | None = None, width: int = WIDE,
                  wide: bool = False, slo: Mapping[str, Mapping[str, list[int]]] | None = None,
                  jain: float | None = None) -> Group:
    """Tenants with their entitled share; with `served` (a live daemon's served_share), the
    dominant share each was recently served beside it, and a line saying which share is which;
    with `slo` (live_first_tokens), each tenant's first tokens on target per class; `jain`: the
    fairness figure (live_fairness) under the table."""
    entitled = tenant_entitlements(tenants)
    cols = [Col("tenant"), Col("weight", justify="right"), Col("entitled", justify="right")]
    if served is not None:
        cols.append(Col("served recently", "served", justify="right"))
    if slo is not None:
        cols.append(Col("first token on target", "on target", drop=1))
    cols += [Col("active jobs", "jobs", drop=2, justify="right"), Col("queued", justify="right"),
             Col("running", justify="right")]
    rows = []
    for tenant in tenants:
        active = tenant.queued or tenant.running
        share = entitled[tenant.name]
        cells = [tenant.name, f"{tenant.weight:g}", Text(percent(share), style="" if active else "dim")]
        if served is not None:
            cells.append(served_cell(served.get(tenant.name, 0.0), share, bool(active)))
        if slo is not None:
            cells.append(attainment_cell(slo.get(tenant.name, {})))
        cells += [str(tenant.active_jobs), f"{tenant.queued:,}", f"{tenant.running:,}"]
        rows.append(cells)
    legend = SHARES_LEGEND if wide or width >= len(SHARES_LEGEND) + 2 else SHARES_LEGEND_SHORT
    if served is None:
        legend = legend.split(";")[0]
    if jain is not None:
        legend += f"; Jain's index of served over entitled: {jain:.3f}"
    return with_legend(fitted_table("Tenants", cols, rows, width, wide), Text("  " + legend, style="dim"))


def attainment_cell(classes: Mapping[str, list[int]]) -> str:
    """A tenant's first tokens on target per class: `realtime 98% of 1,204` ..., a dash for none."""
    parts = []
    for c in RequestClass:
        n, on = classes.get(c.value, (0, 0))
        if n:
            parts.append(f"{c.value} {on / n:.0%} of {n:,}")
    return "  ".join(parts) or NO_SHARE


def percent(share: float | None) -> str:
    """A share as a whole percentage; a dash for none."""
    return NO_SHARE if share is None else f"{share:.0%}"


def served_cell(served: float, entitled: float | None, active: bool) -> Text:
    """Served dominant share; yellow when an active tenant is more than 5 points off its entitlement."""
    off = active and entitled is not None and abs(served - entitled) > 0.05
    return Text(f"{served:.0%}", style="yellow" if off else ("" if active else "dim"))


def daemon_panel(daemon: DaemonSummary, now: float, width: int = WIDE) -> Panel:
    """The live daemon's engine figures (from its heartbeat), a figure never split across lines."""
    s = daemon.stats
    kv_pct = f" ({s.kv_tokens / s.kv_budget:.0%})" if s.kv_budget else ""
    groups = [
        [f"[bold]model[/] {daemon.model}", f"[bold]device[/] {daemon.device}",
         f"[bold]policy[/] {s.policy or '?'}", f"[bold]daemon[/] {daemon.id} (pid {daemon.pid})"],
        [f"[bold]batch[/] {s.batch}", f"[bold]running[/] {s.running}", f"[bold]waiting[/] {s.waiting}",
         f"[bold]held[/] {s.held}", f"[bold]KV[/] {s.kv_tokens:,}/{s.kv_budget:,} tokens{kv_pct}"],
        [f"[bold]tok/s[/] {s.tok_s:,.1f}", f"[bold]step[/] {s.step_ms:.1f} ms", f"[bold]steps[/] {s.steps:,}",
         f"[bold]tokens[/] {s.tokens:,}", f"[bold]heartbeat[/] {daemon.heartbeat_age(now):.1f}s ago"],
        [f"[bold]preemptions[/] {s.preemptions:,}", f"[bold]preemption cost[/] {preemption_cost(s)}"],
    ]
    lines = [line for items in groups for line in packed(items, width - 4)]
    return Panel("\n".join(lines), title="Daemon", title_align="left", expand=False)


def preemption_cost(s) -> str:
    """KV tokens recomputed or parked by preemptions over tokens computed, since the daemon started."""
    if not s.tokens_computed:
        return NO_SHARE
    return f"{(s.tokens_recomputed + s.tokens_parked) / s.tokens_computed:.2%} of tokens computed"


def packed(items: list[str], width: int, gap: str = "   ") -> list[str]:
    """Items joined into lines of at most `width` visible characters, an item never split."""
    lines, line = [], ""
    for item in items:
        candidate = f"{line}{gap}{item}" if line else item
        if line and Text.from_markup(candidate).cell_len > width:
            lines.append(line)
            candidate = item
        line = candidate
    return [*lines, line] if line else lines


def why_table(requests: tuple[RequestStanding, ...] | list[RequestStanding], width: int = WIDE,
              wide: bool = False) -> Group:
    """Why each running or waiting request runs or waits, in the scheduler's order (as Slurm's sprio):
    class, tier (precedence or share), base priority, wait, whether it is late, tenant's DRF share."""
    cols = [Col("req", justify="right"), Col("tenant"), Col("class"), Col("state"), Col("tier"),
            Col("priority", "pri", drop=3, justify="right"), Col("waited", justify="right"), Col("late"),
            Col("generated", "gen", drop=2, justify="right"),
            Col("tenant share", "share", drop=1, justify="right")]
    rows = []
    for r in requests:
        running = r.status is RequestStatus.RUNNING
        rows.append([r.id, r.tenant, r.request_class.value,
                     Text(r.status.word, style="cyan" if running else "yellow"), r.tier, str(r.priority),
                     f"{r.waited_s:.1f}s", Text("late", style="red") if r.late else "", f"{r.generated:,}",
                     f"{r.tenant_share:.3f}"])
    return with_legend(fitted_table("Why (running, then waiting in admission order)", cols, rows, width, wide,
                                    empty="nothing running or waiting"))


def daemons_table(daemons: list[DaemonSummary], now: float, width: int = WIDE, wide: bool = False) -> Group:
    cols = [Col("daemon", shrink_to=12), Col("host", drop=2, shrink_to=8), Col("device", drop=3),
            Col("heartbeat", justify="right"), Col("batch", drop=1, justify="right"),
            Col("tokens/s", "tok/s", justify="right"), Col("state")]
    styles = {"alive": "green", "stopped": "dim", "dead": "red"}
    rows = []
    for daemon in daemons:
        state = daemon.state(now)
        alive = state == "alive"  # a dead or stopped daemon's last figures are not shown as current
        rows.append([daemon.id, daemon.host, daemon.device, f"{format_age(daemon.heartbeat_age(now))} ago",
                     str(daemon.stats.batch) if alive else "", f"{daemon.stats.tok_s:,.0f}" if alive else "",
                     Text(state, style=styles[state])])
    return with_legend(fitted_table("Daemons", cols, rows, width, wide))


def status_view(snapshot: StatusSnapshot, width: int = WIDE, wide: bool = False) -> Group:
    """Every part of `fsched status`, each fitted to `width` columns (all of them with `wide`)."""
    return Group(*status_parts(snapshot, width, wide))


def within_height(parts: list, console: Console, height: int) -> Group:
    """The parts that fit `height` lines, whole, and a line saying what was left out (a live view
    taller than its terminal would scroll away or be cut mid-table)."""
    kept, used = [], 0
    for n, part in enumerate(parts):
        lines = len(console.render_lines(part, console.options, pad=False))
        if used + lines > height - 1 and kept:
            rest = len(parts) - n
            kept.append(Text(f"({rest} more part(s) below: a taller terminal shows them; "
                             "fsched status without --watch prints everything)", style="dim"))
            break
        kept.append(part)
        used += lines
    return Group(*kept)


def status_parts(snapshot: StatusSnapshot, width: int = WIDE, wide: bool = False) -> list:
    live = newest_live_daemon(snapshot.daemons, snapshot.now)
    served = dict(live.stats.served_share) if live is not None else None
    slo = live_first_tokens(snapshot) if live is not None else None
    # The files and batches first, then the shares; a live view short of lines keeps these.
    parts = [jobs_table(snapshot.jobs, snapshot.now, width, wide),
             tenants_table(snapshot.tenants, served, width, wide, slo, live_fairness(snapshot))]
    if snapshot.online:
        parts.append(online_table(snapshot.online, width, wide))
    if live is not None:
        parts += [daemon_panel(live, snapshot.now, WIDE if wide else width),
                  why_table(live.stats.requests, width, wide)]
    if snapshot.daemons:
        parts.append(daemons_table(snapshot.daemons, snapshot.now, width, wide))
    else:
        parts.append(Text("No daemon has run on this job table yet (start one: fsched daemon).", style="dim"))
    return parts
