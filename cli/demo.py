"""`fsched demo`: two tenants weighted 3:1 and a realtime chat share the tiny model, live.

It runs on its own job table (a temporary one unless --db), starts `fsched
daemon` as a subprocess, submits batch work of alice (weight 3) and bob
(weight 1) made from the packaged corpus (core/data/corpus.txt), plus the
packaged sample chat turns (core/data/sample_jobs/chat.jsonl) as bob's
realtime requests arriving while the batch work runs, shows the status view
until everything has finished, and summarises what happened.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    UserError,
    fail,
    handle_errors,
    note,
    open_catalog,
    print_json,
)
from fsched.cli.daemon import POLICY_NAMES
from fsched.core.daemon.build import DEFAULTS
from fsched.core.jobs.jobstate import JobSummary
from fsched.core.ports.records import RequestTiming
from fsched.core.sched.policy import POLICIES
from fsched.core.types import RequestClass

WEIGHTS = {"alice": 3.0, "bob": 1.0}
# Batch work: short prompts (a sentence of the corpus) and short outputs, sized so
# the demo takes about a minute on a 2-core CPU with the tiny model and both
# tenants stay backlogged for most of it (alice, served 3x faster, has more).
BATCH_REQUESTS = {"alice": 450, "bob": 180}
BATCH_MAX_TOKENS = 48
REALTIME_EVERY_S = 5.0  # bob's chat turns arrive this far apart once the daemon serves
DAEMON_START_TIMEOUT_S = 300.0  # the first run builds the tiny model
STOP_TIMEOUT_S = 15.0
REFRESH_S = 0.5


def sample_lines(name: str) -> list[dict]:
    text = resources.files("fsched.core").joinpath(f"data/sample_jobs/{name}").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


def corpus_prompts(n: int, offset: int = 0) -> list[dict]:
    """`n` batch requests, each continuing one sentence of the packaged corpus (greedy)."""
    text = resources.files("fsched.core").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    sentences = [s.strip() + "." for s in text.replace("\n", " ").split(". ") if len(s.split()) >= 5]
    return [
        {"custom_id": f"s{i}", "prompt": sentences[(offset + i) % len(sentences)],
         "max_tokens": BATCH_MAX_TOKENS, "temperature": 0}
        for i in range(n)
    ]


# -- the summary: pure functions of what was observed ---------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(slots=True, frozen=True)
class TokenMark:
    """The output tokens each tenant had been served by a moment."""

    at: float
    tokens: dict[str, int]


@dataclass(slots=True)
class ShareWindow:
    """Tokens served per tenant while every tenant still had batch work (both backlogged)."""

    start: TokenMark | None = None
    end: TokenMark | None = None
    daemon_share: dict[str, float] = field(default_factory=dict)

    def observe(self, now: float, jobs: list[JobSummary], served_share: dict[str, float] | None) -> None:
        batch_busy = {
            j.tenant for j in jobs if j.request_class is RequestClass.BATCH and not j.state.finished
        }
        if not set(WEIGHTS) <= batch_busy:
            return
        tokens = {t: sum(j.num_output_tokens for j in jobs if j.tenant == t) for t in WEIGHTS}
        if self.start is None:
            if all(tokens.values()):  # warm-up: both have been served something
                self.start = TokenMark(now, tokens)
            return
        self.end = TokenMark(now, tokens)
        if served_share:
            self.daemon_share = dict(served_share)

    def shares(self) -> tuple[float, dict[str, float]]:
        if self.start is None or self.end is None:
            return 0.0, {}
        served = {t: self.end.tokens[t] - self.start.tokens[t] for t in WEIGHTS}
        total = sum(served.values())
        return self.end.at - self.start.at, ({t: v / total for t, v in served.items()} if total else {})


def summary(timings: list[RequestTiming], window: ShareWindow, policy: str, startup_s: float,
            serve_s: float) -> dict:
    classes = {}
    for request_class in RequestClass:
        mine = [t for t in timings if t.request_class is request_class]
        if not mine:
            continue
        ttft = [(t.first_token_at - t.enqueued_at) * 1000 for t in mine if t.first_token_at is not None]
        p50, p99 = percentile(ttft, 50), percentile(ttft, 99)
        classes[request_class.value] = {
            "requests": len(mine),
            "done": sum(t.status.succeeded for t in mine),
            "tokens": sum(t.num_output_tokens for t in mine),
            "ttft_p50_ms": None if p50 is None else round(p50, 1),
            "ttft_p99_ms": None if p99 is None else round(p99, 1),
        }
    total = sum(t.num_output_tokens for t in timings)
    contended_s, contended = window.shares()
    weight_sum = sum(WEIGHTS.values())
    tenants = {}
    for name, weight in WEIGHTS.items():
        tokens = sum(t.num_output_tokens for t in timings if t.tenant == name)
        tenants[name] = {
            "weight": weight,
            "entitled_share": round(weight / weight_sum, 4),
            "tokens": tokens,
            "token_share": round(tokens / total, 4) if total else None,
            "contended_token_share": round(contended[name], 4) if name in contended else None,
            "daemon_served_share": window.daemon_share.get(name),
        }
    return {
        "policy": policy,
        "requests": len(timings),
        "tokens": total,
        "startup_s": round(startup_s, 1),
        "serve_s": round(serve_s, 1),
        "tok_s": round(total / serve_s, 1) if serve_s > 0 else None,
        "contended_s": round(contended_s, 1),
        "classes": classes,
        "tenants": tenants,
    }


def summary_view(s: dict):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def ms(v):
        return "n/a" if v is None else f"{v:,.0f} ms"

    def pct(v):
        return "n/a" if v is None else f"{v:.0%}"

    classes = Table(title="First token by class", title_justify="left")
    for column in ("class", "requests", "done", "tokens", "p50", "p99"):
        classes.add_column(column, justify="left" if column == "class" else "right")
    for name, c in s["classes"].items():
        classes.add_row(name, str(c["requests"]), str(c["done"]), f"{c['tokens']:,}", ms(c["ttft_p50_ms"]),
                        ms(c["ttft_p99_ms"]))
    tenants = Table(title=f"Tenants (both backlogged for {s['contended_s']:.0f} s)", title_justify="left")
    for column in ("tenant", "weight", "entitled", "tokens", "served over the run", "while backlogged",
                   "served recently"):
        tenants.add_column(column, justify="left" if column == "tenant" else "right")
    for name, t in s["tenants"].items():
        tenants.add_row(name, f"{t['weight']:g}", pct(t["entitled_share"]), f"{t['tokens']:,}",
                        pct(t["token_share"]), pct(t["contended_token_share"]), pct(t["daemon_served_share"]))
    line = (f"{s['requests']} requests, {s['tokens']:,} tokens in {s['serve_s']:.1f} s: "
            f"{s['tok_s'] or 0:,.1f} tok/s (policy {s['policy']}; model loaded in {s['startup_s']:.1f} s)")
    legend = Text("  entitled: weight over the weights of the tenants with work; served over the run: its "
                  "part of the tokens generated (while backlogged: while both had work waiting); served "
                  "recently: the daemon's decayed part of the dominant resource at the end", style="dim")
    return Group(classes, tenants, legend, line)


# -- the command ---------------------------------------------------------------------------


@handle_errors
def demo(
    policy: Annotated[str, typer.Option("--policy", help=f"One of {POLICY_NAMES}.")] = DEFAULTS.policy,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for the daemon.")] = None,
    size: Annotated[float, typer.Option("--size", help="Scale the batch work (1: about a minute on a "
                                        "2-core CPU).")] = 1.0,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Watch two tenants (weights 3:1) and a realtime chat share the tiny model, then a summary.

    Uses its own job table (a temporary one unless --db), starts and stops its
    own daemon. Takes about a minute on a laptop CPU.
    """
    if policy not in POLICIES:
        raise UserError(f"--policy must be one of {POLICY_NAMES}, got {policy!r}")
    if not 0 < size <= 100:
        raise UserError(f"--size must be within (0, 100], got {size:g}")
    # Ctrl-C stops the demo (and its daemon) even where the shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="fsched-demo-") as tmp:
        url = db or f"sqlite:///{Path(tmp) / 'fsched.db'}"
        _run(url, Path(tmp), policy, threads, size, as_json)


def _run(url: str, tmp: Path, policy: str, threads: int | None, size: float, as_json: bool) -> None:
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission, TenantExists

    store = open_catalog(url)
    for name, weight in WEIGHTS.items():
        try:
            store.add_tenant(name, weight)
        except TenantExists:
            store.set_weight(name, weight)

    def job(tenant: str, request_class: RequestClass, name: str, lines: list[dict]) -> JobSubmission:
        return JobSubmission(parse_job_file(jsonl(lines), name), tenant, request_class, 5, name)

    batch = store.submit([
        job(tenant, RequestClass.BATCH, f"{tenant}-batch", corpus_prompts(max(1, round(n * size)), 1000 * i))
        for i, (tenant, n) in enumerate(BATCH_REQUESTS.items())
    ])
    chats = sample_lines("chat.jsonl")
    job_ids = [j.job_id for j in batch]

    log_path = tmp / "daemon.log"
    command = [sys.executable, "-m", "fsched.cli.main", "daemon", "--db", url, "--quiet", "--policy", policy]
    if threads:
        command += ["--threads", str(threads)]
    started = time.time()
    with open(log_path, "wb") as log:
        # Its own session: Ctrl-C reaches the demo only, which stops the daemon itself.
        daemon = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    try:
        if not as_json:
            note(f"fsched demo: daemon pid {daemon.pid} on {url}; alice (weight 3) and bob (weight 1) "
                 f"have {sum(j.num_requests for j in batch)} batch requests; Ctrl-C stops")
        serving_at, window, finished_at = _watch(store, daemon, started, log_path, job_ids, chats, job,
                                                    max(0.5, REALTIME_EVERY_S * size), as_json)
    except KeyboardInterrupt:
        _stop(daemon)
        note("fsched: demo interrupted; daemon stopped")
        raise typer.Exit(130) from None
    except BaseException:
        _stop(daemon)
        raise
    code = _stop(daemon)
    if code not in (0, None):
        fail(f"the daemon exited with status {code}: {_tail(log_path)}")
    result = summary(store.request_timings(job_ids), window, policy, serving_at - started,
                     finished_at - serving_at)
    if as_json:
        print_json(result)
        return
    from rich.console import Console

    Console().print(summary_view(result))


def _watch(store, daemon, started: float, log_path: Path, job_ids: list[int], chats: list[dict], job,
           chat_every_s: float, as_json: bool):
    """Show the live view until every job has finished; submit bob's chats on the way.

    Returns (when the daemon first served, the share window, when all finished).
    """
    from contextlib import nullcontext

    from fsched.cli.report import StatusSnapshot
    from fsched.core.ports.records import newest_live_daemon

    live_cm = nullcontext()
    if not as_json:
        from rich.live import Live

        live_cm = Live(auto_refresh=False, screen=False)
    window = ShareWindow()
    serving_at = None
    next_chat = 0
    with live_cm as live:
        while True:
            if daemon.poll() is not None:
                fail(f"the daemon exited early with status {daemon.returncode}: {_tail(log_path)}")
            now = time.time()
            daemons = store.list_daemons()
            alive = newest_live_daemon(daemons, now)
            if serving_at is None and alive is not None:
                serving_at = now
            elif serving_at is None and now - started > DAEMON_START_TIMEOUT_S:
                fail(f"the daemon did not start within {DAEMON_START_TIMEOUT_S:.0f} s: {_tail(log_path)}")
            chat_due = serving_at is not None and now >= serving_at + (next_chat + 1) * chat_every_s
            if chat_due and next_chat < len(chats):
                line = {**chats[next_chat], "custom_id": "chat"}
                name = f"bob-chat-{next_chat + 1}"
                (sub,) = store.submit([job("bob", RequestClass.REALTIME, name, [line])])
                job_ids.append(sub.job_id)
                next_chat += 1
            jobs = store.list_jobs()
            window.observe(now, jobs, dict(alive.stats.served_share) if alive else None)
            if live is not None:
                from fsched.cli.views import status_view

                snapshot = StatusSnapshot(jobs=jobs, tenants=store.list_tenants(), daemons=daemons, now=now)
                live.update(status_view(snapshot, live.console.width), refresh=True)
            if next_chat == len(chats) and all(j.state.finished for j in jobs if j.id in job_ids):
                return serving_at, window, now
            time.sleep(REFRESH_S)


def _stop(daemon: subprocess.Popen) -> int | None:
    """SIGTERM the daemon and wait for it (it flushes and exits within 5 s); kill it past the limit."""
    if daemon.poll() is None:
        os.kill(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    return daemon.returncode


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(no output)"
