"""The status views are pure builders: hand-made snapshots in, the rendered text checked."""

from __future__ import annotations

import pytest
from rich.console import Console

from fsched.cli.report import StatusSnapshot, status_json, tenant_entitlements
from fsched.cli.views import daemon_panel, status_view, tenants_table, why_table
from fsched.core.jobs.jobstate import JobCounts, JobSummary
from fsched.core.ports.records import (
    DaemonStats,
    DaemonSummary,
    TenantSummary,
    newest_live_daemon,
)
from fsched.core.sched.explain import RequestStanding
from fsched.core.types import JobState, RequestClass, RequestStatus

NOW = 1_000_000.0


def render(renderable) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def daemon(id="vm:1:abc", heartbeat_age=0.5, stopped=False, **stats) -> DaemonSummary:
    base = {
        "policy": "fsched", "steps": 1234, "tokens": 56789, "tok_s": 412.3, "step_ms": 37.25, "batch": 17,
        "running": 17, "waiting": 40, "held": 57, "kv_tokens": 8192, "kv_budget": 32768,
        "served_share": {"alice": 0.7412, "bob": 0.2588}, "weights": {"alice": 3.0, "bob": 1.0},
        "requests": (
            RequestStanding("11", "alice", RequestClass.BATCH, RequestStatus.RUNNING, 5, 0.0, 42, 0.2471),
            RequestStanding("97", "bob", RequestClass.STREAMING, RequestStatus.WAITING, 3, 7.5, 0, 0.0863,
                            tier="precedence", late=True),
        ),
    }
    base.update(stats)
    return DaemonSummary(id=id, host="vm", pid=4321, device="cpu", model="fsched-tiny", started_at=NOW - 60,
                         heartbeat_at=NOW - heartbeat_age, stopped_at=NOW if stopped else None,
                         stats=DaemonStats(**base))


TENANTS = [TenantSummary("alice", 3.0, 1, 30, 12), TenantSummary("bob", 1.0, 1, 10, 5),
           TenantSummary("carol", 1.0, 0, 0, 0)]
JOBS = [JobSummary(1, "alice", RequestClass.BATCH, 5, "summaries", JobState.IN_PROGRESS,
                   JobCounts(num_requests=50, num_done=8, num_failed=0, num_cancelled=0, num_running=12),
                   900, NOW - 30, NOW - 29, None)]


def test_daemon_panel_shows_the_engine_figures():
    text = render(daemon_panel(daemon(heartbeat_age=1.25), NOW))
    for figure in ("fsched-tiny", "cpu", "policy fsched", "batch 17", "running 17", "waiting 40",
                   "KV 8,192/32,768 tokens (25%)", "tok/s 412.3", "step 37.2 ms", "heartbeat 1.2s ago"):
        assert figure in text, (figure, text)


def test_tenants_table_puts_served_share_beside_entitled_share():
    text = render(tenants_table(TENANTS, {"alice": 0.7412, "bob": 0.2588}))
    header = next(line for line in text.splitlines() if "tenant" in line)
    assert header.index("entitled") < header.index("served")

    def cells(name: str) -> list[str]:
        line = next(line for line in text.splitlines() if f" {name} " in line)
        return [c.strip() for c in line.split("│")[1:-1]]

    # tenant, weight, entitled (alice and bob have work: 3/4 and 1/4), served, ...
    assert cells("alice")[:4] == ["alice", "3", "75%", "74%"]
    assert cells("bob")[:4] == ["bob", "1", "25%", "26%"]
    assert cells("carol")[3] == "0%"  # idle, never served
    assert "served" not in render(tenants_table(TENANTS))


def test_why_table_explains_each_request_like_sprio():
    text = render(why_table(daemon().stats.requests))
    running = next(line for line in text.splitlines() if " 11 " in line)
    waiting = next(line for line in text.splitlines() if " 97 " in line)
    for figure in ("running", "batch", "share", "42", "0.247"):
        assert figure in running, (figure, running)
    assert "late" not in running
    for figure in ("waiting", "streaming", "precedence", "7.5s", "late", "0.086"):
        assert figure in waiting, (figure, waiting)
    assert text.index(" 11 ") < text.index(" 97 ")  # the order the daemon gave
    assert "nothing running or waiting" in render(why_table([]))


def test_the_heartbeat_reads_back_as_written_and_keeps_the_keys_status_json_shows():
    stats = daemon().stats
    doc = stats.to_json()
    assert DaemonStats.from_json(doc) == stats
    assert set(doc) >= {"policy", "steps", "tokens", "tok_s", "step_ms", "batch", "running", "waiting",
                        "held", "kv_tokens", "kv_budget", "served_share", "weights", "weights_applied_at",
                        "lease_s", "fenced_writes", "lost_leases", "preemptions", "requests"}
    assert set(doc["requests"][1]) == {"id", "tenant", "class", "state", "band", "aged_band", "age_boost",
                                       "level", "priority", "waited_s", "generated", "tenant_share",
                                       "in_share", "tier", "late"}
    assert doc["requests"][1]["id"] == "97" and doc["requests"][1]["band"] == 1
    (shown,) = status_json(StatusSnapshot([], TENANTS, [daemon()], NOW))["daemons"]
    assert shown["stats"] == doc and shown["alive"] and shown["state"] == "alive"
    # A row an older daemon wrote: what it did not publish reads as the defaults.
    old = DaemonStats.from_json({"batch": 3, "requests": [{k: v for k, v in doc["requests"][0].items()
                                                            if k not in ("in_share", "tier", "late")}]})
    assert old.batch == 3 and old.preemptions == 0 and old.lease_s is None and old.requests[0].tier == "share"


def test_a_daemon_is_dead_once_silent_past_its_lease():
    assert daemon(heartbeat_age=9.0, lease_s=10.0).alive(NOW)
    assert daemon(heartbeat_age=11.0, lease_s=10.0).state(NOW) == "dead"
    assert daemon(heartbeat_age=11.0).alive(NOW)  # no lease published: 15 s
    assert daemon(heartbeat_age=16.0).state(NOW) == "dead"
    assert daemon(heartbeat_age=0.0, stopped=True).state(NOW) == "stopped"


def test_status_view_uses_the_newest_live_daemon_only():
    dead = daemon(id="vm:9:old", heartbeat_age=100, served_share={"alice": 0.1, "bob": 0.9})
    stopped = daemon(id="vm:8:stp", heartbeat_age=0.1, stopped=True, policy="fcfs")
    live = daemon(id="vm:1:new", heartbeat_age=0.5)
    snapshot = StatusSnapshot(jobs=JOBS, tenants=TENANTS, daemons=[stopped, live, dead], now=NOW)
    assert newest_live_daemon(snapshot.daemons, NOW) is live
    text = render(status_view(snapshot))
    assert "Daemon" in text and "policy fsched" in text and "policy fcfs" not in text
    assert "74%" in text and "90%" not in text  # served share from the live daemon, not the dead one
    assert "Why" in text and "precedence" in text
    assert "vm:9:old" in text and "dead" in text  # every daemon still listed


def test_status_view_without_a_live_daemon_has_no_panel_and_no_served_column():
    snapshot = StatusSnapshot(jobs=JOBS, tenants=TENANTS, daemons=[daemon(heartbeat_age=100)], now=NOW)
    assert newest_live_daemon(snapshot.daemons, NOW) is None
    text = render(status_view(snapshot))
    assert "served" not in text and "Why" not in text and "tok/s" not in text
    assert "dead" in text
    empty = render(status_view(StatusSnapshot(jobs=[], tenants=[], daemons=[], now=NOW)))
    assert "No daemon has run" in empty


IDLE = [TenantSummary("alice", 3.0, 0, 0, 0), TenantSummary("bob", 1.0, 0, 0, 0)]


def test_no_tenant_with_work_means_no_entitled_share():
    assert tenant_entitlements(IDLE) == {"alice": None, "bob": None}
    text = render(tenants_table(IDLE))
    for name in ("alice", "bob"):
        line = next(line for line in text.splitlines() if f" {name} " in line)
        assert [c.strip() for c in line.split("│")[1:4]] == [name, "3" if name == "alice" else "1", "–"]
    assert "100%" not in text
    shares = [t["entitled_share"] for t in status_json(StatusSnapshot([], IDLE, [], NOW))["tenants"]]
    assert shares == [None, None]


def test_entitled_shares_are_by_weight_among_the_tenants_with_work():
    entitled = tenant_entitlements(TENANTS)  # alice 3 and bob 1 have work; carol has none
    assert entitled["alice"] == 0.75 and entitled["bob"] == 0.25
    assert entitled["carol"] == pytest.approx(1 / 5)  # what she would get by submitting now
    busy = [TenantSummary("alice", 3.0, 1, 4, 0), TenantSummary("bob", 1.0, 0, 0, 0)]
    assert tenant_entitlements(busy) == {"alice": 1.0, "bob": 0.25}
    tenants = status_json(StatusSnapshot([], busy, [], NOW))["tenants"]
    assert [t["entitled_share"] for t in tenants] == [1.0, 0.25]


def header_rows(text: str) -> list[str]:
    """Each table's header row: the line under its top border."""
    lines = text.splitlines()
    return [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.lstrip().startswith("┏")]


def busy_snapshot() -> StatusSnapshot:
    from fsched.core.ports.records import OnlineGroup

    jobs = [JobSummary(i, "alice" if i % 2 else "bob", RequestClass.BATCH, 5,
                       f"nightly-summaries-of-the-{i}th-corpus.jsonl", JobState.IN_PROGRESS,
                       JobCounts(num_requests=5000, num_done=1234, num_running=64), 123_456_789, NOW - 4000,
                       NOW - 3990, None) for i in range(1, 5)]
    online = [OnlineGroup("bob", "5b0ba172f1b6", 3200, 12, 3180, 5, 3, 204_800, NOW, 480, 0.112, 0.9)]
    return StatusSnapshot(jobs=jobs, tenants=TENANTS, daemons=[daemon(id="gpu-box-01:daemon:31337:beef")],
                          now=NOW, online=online)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_status_fits_the_terminal_with_whole_headers_and_a_legend(width):
    from fsched.cli.views import status_view

    console = Console(record=True, width=width, color_system=None)
    console.print(status_view(busy_snapshot(), width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    headers = header_rows(text)
    assert len(headers) == 5  # jobs, tenants, online requests, why, daemons
    for row in headers:
        assert "…" not in row, row
    for column in ("id", "tenant", "state", "done", "entitled", "served", "class", "waited", "in flight" if
                   width >= 120 else "now"):
        assert any(column in row for row in headers), column
    assert ("entitled: weight over the weights of tenants with work; served recently" in text
            or "entitled: weight/weights with work; served recently" in text)  # whole, on one line
    if width == 80:
        assert "not shown at this width" in text and "--wide shows all" in text


def test_wide_shows_every_column():
    from fsched.cli.views import status_view

    console = Console(record=True, width=400, color_system=None)
    console.print(status_view(busy_snapshot(), 80, wide=True))
    text = console.export_text()
    for column in ("priority", "progress", "tokens", "age", "generated", "tenant share", "cancelled",
                   "first token p50", "active jobs", "host", "device"):
        assert column in text, column
    assert "not shown at this width" not in text


def test_online_requests_are_grouped_apart_from_the_jobs():
    from fsched.cli.views import status_view

    text = render(status_view(busy_snapshot()))
    assert text.index("Jobs") < text.index("Tenants") < text.index("Online requests")
    line = next(row for row in text.splitlines() if "5b0ba172f1b6" in row)
    for figure in ("bob", "3,200", "12", "112 ms", "900 ms"):
        assert figure in line, (figure, line)


def test_a_live_view_keeps_whole_parts_within_the_terminal_height():
    from fsched.cli.views import status_parts, within_height

    console = Console(record=True, width=80, height=24, color_system=None)
    console.print(within_height(status_parts(busy_snapshot(), 80), console, 24))
    text = console.export_text()
    assert len(text.splitlines()) <= 24
    assert "more part(s) below" in text and "Jobs" in text


def test_status_shows_each_tenants_first_tokens_on_target_the_fairness_figure_and_preemption_cost():
    """Summed over the live daemons (a stopped one's counts are not live figures); Jain's index of
    the newest daemon's served over entitled shares (alice 0.7412 of 0.75, bob 0.2588 of 0.25)."""
    one = daemon(first_tokens={"alice": {"realtime": [10, 9]}, "bob": {"batch": [4, 2]}},
                 tokens_computed=10_000, tokens_recomputed=150, tokens_parked=50)
    two = daemon(id="vm:2:def", heartbeat_age=0.7, first_tokens={"alice": {"realtime": [10, 10]}})
    gone = daemon(id="vm:3:old", stopped=True, first_tokens={"alice": {"realtime": [50, 0]}})
    snapshot = StatusSnapshot(jobs=JOBS, tenants=TENANTS, daemons=[one, two, gone], now=NOW)
    doc = status_json(snapshot)
    tenants = {t["name"]: t for t in doc["tenants"]}
    assert tenants["alice"]["slo"] == {"realtime": {"first_tokens": 20, "on_target": 19, "attainment": 0.95}}
    assert tenants["bob"]["slo"]["batch"]["attainment"] == 0.5 and tenants["carol"]["slo"] == {}
    ratios = [0.7412 / 0.75, 0.2588 / 0.25]
    jain = sum(ratios) ** 2 / (2 * sum(x * x for x in ratios))
    assert doc["fairness_jain"] == pytest.approx(jain, abs=1e-4)
    text = render(status_view(snapshot))
    assert "realtime 95% of 20" in text and "batch 50% of 4" in text
    assert "Jain's index of served over entitled:" in text and f"{jain:.3f}" in text
    assert "preemption cost 2.00% of tokens computed" in render(daemon_panel(one, NOW))
