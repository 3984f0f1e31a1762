"""A trace replayed live (`fsched replay`) against an engine alone and against fsched in front of it, beside
`fsched simulate` on the same requests, in one run.

    .venv/bin/python bench/replay_live.py [--limit 400] [--rate-scale 1] [--slots 16] [--step-ms 20]
        [--mix 5/15/80] [--seed 0] [--vllm [--engine-nice 10]] [--out FILE.md]

The trace is the first `--limit` requests of the Azure conversation trace
(`--trace` for another), tenants a=3 and b=1 drawn uniformly, classes by
`--mix`, arrivals scaled by `--rate-scale`: the same draws for every arm.

Paced (the default): the engine is the paced stand-in (its own process,
`--slots` streams, one token each every `--step-ms`). Arms: `fsched replay`
straight to the engine (FCFS over its slots, no tenants: the engine alone),
and through `fsched serve` + `fsched daemon --engine URL --model standin`
(SQLite, keys of class realtime, weights 3:1). Simulated: the same requests
through `fcfs` and `fsched` with the `paced` cost model at `--step-ms` and
`--max-batch` = slots, what `fsched simulate --cost-model paced --max-batch
SLOTS` runs.

`--vllm`: the engine is vLLM's CPU build serving the tiny model
(`--max-num-seqs` = slots, its session at `--engine-nice`, as
bench/remote_engine.py says why). Prompts are cut to fit the model's 2,048
tokens (prompt + output + 32 at most), written as an fsched JSONL trace that
every arm reads. The cost model is fitted to that vLLM first, from three
probes sent with the replayer itself: decode steps at batch 1 and at
`--slots` (per-token time of 128-token outputs) and a 1,500-token prompt's
first token (the median of three sent alone): step_s = base + token_s x
tokens, least squares.

Per arm it prints a JSON line; then a Markdown table: per class TTFT p50,
p99 and the fraction on target, goodput; each tenant's tokens served while
both had work outstanding over all tokens then (the same measure, from the
request records, for simulated and live runs), Jain's index over it,
throughput, makespan; and the client's CPU (user + sys of the replay
process) per token. The fsched arm's line also gives the CPU its server and
daemon used (per token, and in cores over the run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fast_path import FSCHED, Engine, Table, cpu_s  # noqa: E402
from online_path import free_port  # noqa: E402

from fsched.core.replay.report import token_shares  # noqa: E402
from fsched.core.sched.config import SchedulerConfig  # noqa: E402
from fsched.core.sim.costmodel import CostModel, paced_profile  # noqa: E402
from fsched.core.sim.metrics import jain_index  # noqa: E402
from fsched.core.sim.simulator import simulate  # noqa: E402
from fsched.core.sim.trace import load_trace, parse_mix  # noqa: E402

TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
WEIGHTS = {"a": 3.0, "b": 1.0}
CLASSES = ("realtime", "streaming", "batch")


# -- the arms ------------------------------------------------------------------------------------------
def replay(trace: Path, url: str, keys: dict[str, str], args, label: str) -> dict:
    """`fsched replay --json` in its own process; its result, with the client's CPU per token."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    keyed = [f"--key={t}={k}" for t, k in keys.items()]
    proc = subprocess.run([FSCHED, "replay", str(trace), "--url", url, *keyed, "--tenants", "a=3,b=1",
                           *trace_flags(args), "--label", label, "--json"], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"fsched replay failed: {proc.stderr}")
    run = json.loads(proc.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tokens = run["report"]["throughput_tok_s"] * run["report"]["makespan_s"]
    run["client_cpu_us_per_token"] = round(1e6 * cpu / max(1.0, tokens), 1)
    print(json.dumps({"arm": label, **{k: run[k] for k in ("sent", "completed", "refused", "failed",
                                                           "send_lag_max_s", "client_cpu_us_per_token")}}),
          flush=True)
    return run


def trace_flags(args) -> list[str]:
    flags = ["--mix", args.mix, "--seed", str(args.seed), "--rate-scale", str(args.rate_scale)]
    return flags + (["--limit", str(args.limit)] if args.limit else [])


class Fsched:
    """A fresh SQLite table, tenants a=3 and b=1 with a realtime key each, a daemon over the engine and a
    server; `keys` and `url` for the replay."""

    def __init__(self, folder: Path, engine_url: str, model: str, slots: int | None):
        self.table = Table("sqlite", folder)
        for tenant, weight in WEIGHTS.items():
            self.table.fsched("tenants", "add", tenant, "--weight", f"{weight:g}")
        self.keys = {t: self._key(t) for t in WEIGHTS}
        batch = ["--max-batch", str(slots)] if slots else []
        self.daemon = self.table.daemon("--model", model, "--engine", engine_url, *batch)
        self.port = free_port()
        self.server = subprocess.Popen([FSCHED, "serve", "--port", str(self.port), "--no-access-log"],
                                       env=self.table.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self._ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _key(self, tenant: str) -> str:
        out = subprocess.run([FSCHED, "keys", "create", tenant, "--class", "realtime", "--json"],
                             env=self.table.env, check=True, capture_output=True, text=True).stdout
        return json.loads(out)["key"]

    def _ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).json().get("daemons_alive"):
                    time.sleep(1.5)  # the server links to the daemon (every 0.5 s)
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError("fsched did not come up")

    def close(self) -> None:
        for proc in (self.server, self.daemon):
            proc.terminate()
        for proc in (self.server, self.daemon):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.table.close()


def through_fsched(trace: Path, engine_url: str, model: str, slots: int | None, args) -> dict:
    """The replay through fsched, with the CPU its server and daemon used per token over it."""
    with tempfile.TemporaryDirectory() as tmp:
        front = Fsched(Path(tmp), engine_url, model, slots)
        try:
            pids = (front.daemon.pid, front.server.pid)
            before = sum(cpu_s(p) for p in pids)
            run = replay(trace, front.url, front.keys, args, "fsched")
            used, span = sum(cpu_s(p) for p in pids) - before, run["report"]["makespan_s"]
            run["fsched_cpu_us_per_token"] = round(1e6 * used / (run["report"]["throughput_tok_s"] * span), 1)
            run["fsched_cores"] = round(used / span, 2)
            print(json.dumps({k: run[k] for k in ("fsched_cpu_us_per_token", "fsched_cores")}), flush=True)
            return run
        finally:
            front.close()


# -- the simulated runs --------------------------------------------------------------------------------
def simulated(trace: Path, args, cost: CostModel, slots: int) -> dict[str, dict]:
    requests = load_trace(trace, tenants=sorted(WEIGHTS), mix=parse_mix(args.mix), rate_scale=args.rate_scale,
                          limit=args.limit, seed=args.seed)
    out = {}
    for policy in ("fcfs", "fsched"):
        config = SchedulerConfig(max_batch=slots)
        report = simulate(requests, policy, weights=WEIGHTS, config=config, cost=cost)
        doc = report.to_json()
        shares, _ = token_shares(report.records, sorted({r.tenant for r in requests}))
        for t, share in shares.items():
            doc["tenants"][t]["share"] = share
        doc["jain_index"] = jain_index([shares[t] / doc["tenants"][t]["entitled"] for t in shares])
        out[policy] = doc
    return out


# -- vLLM ----------------------------------------------------------------------------------------------
def fitted_trace(args, folder: Path, context: int) -> Path:
    """The trace's draws written out with prompts cut to fit `context`: what every vLLM arm reads."""
    requests = load_trace(args.trace, tenants=sorted(WEIGHTS), mix=parse_mix(args.mix), rate_scale=1.0,
                          limit=args.limit, seed=args.seed)
    path = folder / "trace.jsonl"
    path.write_text("".join(json.dumps({
        "arrival_s": r.arrival_s, "output_tokens": r.output_tokens, "tenant": r.tenant,
        "prompt_tokens": max(1, min(r.prompt_tokens, context - r.output_tokens - 32)),
        "class": r.request_class.value,
    }) + "\n" for r in requests))
    return path


def fit_cost(url: str, model: str, slots: int, folder: Path) -> CostModel:
    """base_s and token_s from the engine's decode steps at batch 1 and `slots`, and a long prompt."""
    points = []
    for batch in (1, slots):
        probe = folder / f"decode{batch}.jsonl"
        probe.write_text("".join(json.dumps({"arrival_s": 0, "prompt_tokens": 16, "output_tokens": 128,
                                             "tenant": "a", "class": "batch"}) + "\n" for _ in range(batch)))
        tpot = _probe(probe, url, model)["batch"]["tpot_p50_s"]
        points.append((batch, tpot))
    probe = folder / "prefill.jsonl"  # three, one at a time: the median
    probe.write_text("".join(json.dumps({"arrival_s": 5 * i, "prompt_tokens": 1500, "output_tokens": 2,
                                         "tenant": "a", "class": "batch"}) + "\n" for i in range(3)))
    points.append((1500, _probe(probe, url, model)["batch"]["ttft_p50_s"]))
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    cost = CostModel(base_s=max(1e-4, my - slope * mx), token_s=max(0.0, slope), kv_token_s=0.0,
                     swap_token_s=0.0)
    print(json.dumps({"fit": points, "base_s": cost.base_s, "token_s": cost.token_s}), flush=True)
    return cost


def _probe(trace: Path, url: str, model: str) -> dict:
    proc = subprocess.run([FSCHED, "replay", str(trace), "--url", url, "--key", "a=", "--model", model,
                           "--json"], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)["report"]["classes"]


# -- the table -----------------------------------------------------------------------------------------
def table_lines(columns: list[tuple[str, dict]], live: dict[str, dict]) -> list[str]:
    """Rows of figures, a column per run (simulated reports' JSON, or a replay's `report`)."""
    head = "| | " + " | ".join(name for name, _ in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]

    def row(label: str, cell) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(doc) for _, doc in columns) + " |")

    for c in CLASSES:
        for key, label in (("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99")):
            row(f"{c} {label}", lambda d, c=c, key=key: _seconds(d["classes"].get(c, {}).get(key)))
        row(f"{c} on target", lambda d, c=c: _fraction(d["classes"].get(c, {}).get("on_target")))
        row(f"{c} goodput /s", lambda d, c=c: _goodput(d, c))
    for t in WEIGHTS:
        row(f"tenant {t} tokens / entitled",
            lambda d, t=t: f"{d['tenants'][t]['share']:.3f} / {d['tenants'][t]['entitled']:.3f}")
    row("Jain (token shares)", lambda d: f"{d['jain_index']:.3f}")
    row("throughput tok/s", lambda d: f"{d['throughput_tok_s']:,.0f}")
    row("makespan", lambda d: f"{d['makespan_s']:.1f} s")
    lines.append("| client CPU µs/token | " + " | ".join(
        str(live[name]["client_cpu_us_per_token"]) if name in live else "" for name, _ in columns) + " |")
    return lines


def _seconds(v) -> str:
    return "-" if v is None else (f"{1000 * v:.0f} ms" if v < 1 else f"{v:.2f} s")


def _fraction(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _goodput(doc: dict, c: str) -> str:
    stats = doc["classes"].get(c)
    return f"{stats['goodput_per_s']:.3g}" if stats else "-"


# -- the run -------------------------------------------------------------------------------------------
def paced_run(args) -> list[str]:
    with Engine(args.slots, args.step_ms) as engine:
        alone = replay(args.trace, engine.url, {"a": "", "b": ""}, args, "engine alone")
        front = through_fsched(args.trace, engine.url, "standin", None, args)
    sims = simulated(args.trace, args, paced_profile(args.step_ms / 1000), args.slots)
    live = {"engine alone, live": alone, "fsched, live": front}
    columns = [("engine alone (fcfs), simulated", sims["fcfs"]), ("engine alone, live", alone["report"]),
               ("fsched, simulated", sims["fsched"]), ("fsched, live", front["report"])]
    return table_lines(columns, live)


def vllm_run(args) -> list[str]:
    from remote_engine import VllmServer, ensure_tiny_model  # torch and transformers: here only

    log = Path(tempfile.gettempdir()) / f"replay_live-vllm-{time.time():.0f}.log"
    print(f"vLLM's log: {log}", file=sys.stderr, flush=True)
    folder = str(ensure_tiny_model())
    server = VllmServer(Path(folder), log, extra=("--max-num-seqs", str(args.slots)))
    # Started at the usual priority (at nice 10 on a busy 2-core machine it took over 15 minutes), then
    # lowered for the measurement, its whole session (bench/remote_engine.py says why).
    server.start(timeout_s=1800)
    try:
        os.setpriority(os.PRIO_PGRP, server.proc.pid, args.engine_nice)
        Path(f"/proc/{server.proc.pid}/autogroup").write_text(str(args.engine_nice))
        with tempfile.TemporaryDirectory() as tmp:
            trace = fitted_trace(args, Path(tmp), 2048)
            cost = fit_cost(server.url, folder, args.slots, Path(tmp))
            args.trace = trace
            alone = replay(trace, server.url, {"a": "", "b": ""}, args, "engine alone")
            front = through_fsched(trace, server.url, folder, args.slots, args)
            sims = simulated(trace, args, cost, args.slots)
    finally:
        server.stop()
    live = {"vLLM alone, live": alone, "fsched + vLLM, live": front}
    columns = [("vLLM alone (fcfs), simulated", sims["fcfs"]), ("vLLM alone, live", alone["report"]),
               ("fsched + vLLM, simulated", sims["fsched"]), ("fsched + vLLM, live", front["report"])]
    return table_lines(columns, live)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--mix", default="5/15/80")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--vllm", action="store_true", help="vLLM's CPU build on the tiny model")
    parser.add_argument("--engine-nice", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = vllm_run(args) if args.vllm else paced_run(args)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
