"""How many online tokens a second one `fsched serve` streams and one daemon relays, and at what CPU.

    .venv/bin/python bench/online_capacity.py [--streams 1024] [--tokens 64] [--rounds 2]
        [--slots 1024] [--step-ms 20] [--backend sqlite] [--client-procs 2] [--split 8]

The engine is the paced stand-in (tests/support/paced_engine.py, its own
process; `--slots` streams at once, one token each every `--step-ms`, 51,200
tok/s at 1,024 x 20 ms). The clients are light (bench/light_client.py): `--client-procs` processes of
raw asyncio protocols (no SDK, no JSON decoded but the usage chunk), one
keep-alive connection per stream, `--streams` streams at once, each sending
`--rounds` streamed chat requests of `--tokens` tokens (greedy, ignore_eos,
include_usage) one after the other. Two arms in one run:
- `direct`: the clients straight to the engine (the baseline);
- `fsched`: the same clients through `fsched serve` + `fsched daemon
  --engine URL` (separate processes, a fresh table on `--backend`).
Per arm: tok/s (usage tokens / wall time from the first request to the last
stream's end), TTFT p50/p99, and CPU µs per token (utime + stime from
/proc/<pid>/stat over the load) of serve, the daemon, the engine and the
clients, with each process's busy share of one core: at that CPU per token
one core would carry 1e6 / µs tok/s, printed as its capacity.

`--split T`: the fsched arm is run again with `T`-token requests (as many
tokens in all, more requests), and each process's CPU is split into a fixed
cost per request and a cost per token (two equations, two unknowns; each
run's idle CPU, measured for 2 s before it, taken out first). On PostgreSQL the
server's own processes (every `postgres` process of this machine: the
sessions of serve's group commit and of the daemon, and the server's
writers) are counted as one more process, `postgres`: a request's row, claim
and completion are work the database does too, so its fixed cost "in all"
is serve's, the daemon's and the database's, printed under the split.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fast_path import Engine, cpu_s, postgres_cpu_s  # noqa: E402
from light_client import LightStream, chat_request, connect  # noqa: E402


# -- the load ----------------------------------------------------------------------------------------
async def _client(url: str, key: str, model: str, streams: int, rounds: int, tokens: int) -> dict:
    request = chat_request(url, key, model, tokens)
    conns = []
    for _ in range(streams):
        conns.append(await connect(url))
    ttfts: list[float] = []
    errors: list[str] = []

    async def run(proto: LightStream) -> int:
        got = 0
        for _ in range(rounds):
            try:
                usage, first = await proto.start(request)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(repr(exc)[:200])
                return got
            got += usage
            if first is not None:
                ttfts.append(first)
        return got

    cpu0 = _own_cpu()
    start = time.perf_counter()
    total = sum(await asyncio.gather(*(run(p) for p in conns)))
    end = time.perf_counter()
    cpu = _own_cpu() - cpu0
    for p in conns:
        p.transport.close()
    return {"tokens": total, "start": start, "end": end, "ttfts": ttfts, "errors": errors, "cpu_s": cpu}


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _client_proc(args: tuple, out) -> None:
    out.send(asyncio.run(_client(*args)))
    out.close()


def load(url: str, key: str, model: str, streams: int, rounds: int, tokens: int, procs: int) -> dict:
    """`streams` light streams over `procs` client processes (started first, then released together)."""
    ctx = multiprocessing.get_context("fork")
    shares = [streams // procs + (1 if i < streams % procs else 0) for i in range(procs)]
    pipes, children = [], []
    for share in shares:
        if not share:
            continue
        mine, theirs = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_client_proc, args=((url, key, model, share, rounds, tokens), theirs))
        child.start()
        pipes.append(mine)
        children.append(child)
    results = [p.recv() for p in pipes]
    for child in children:
        child.join()
    start, end = min(r["start"] for r in results), max(r["end"] for r in results)
    ttfts = sorted(t for r in results for t in r["ttfts"])
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None
    errors = [e for r in results for e in r["errors"]]
    total = sum(r["tokens"] for r in results)
    wall = end - start
    return {"tokens": total, "requests": streams * rounds, "errors": len(errors),
            "error": errors[0] if errors else None, "wall_s": round(wall, 2),
            "tok_s": round(total / wall, 1) if wall else 0.0,
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1) if ttfts else None,
            "ttft_p99_ms": round(1000 * p99, 1) if ttfts else None,
            "client_cpu_s": sum(r["cpu_s"] for r in results)}


# -- the measurement --------------------------------------------------------------------------------
def measured(url: str, key: str, model: str, pids: dict[str, int], args, tokens: int, rounds: int,
             profile: Path | None = None, postgres: bool = False) -> dict:
    """One load, with each process's CPU over it: µs per token, and its busy share of one core;
    `postgres`: PostgreSQL's server processes too, as one (`postgres`)."""
    readers = {n: (lambda pid=p: cpu_s(pid)) for n, p in pids.items()}
    if postgres:
        readers["postgres"] = postgres_cpu_s
    idle0 = {n: read() for n, read in readers.items()}
    time.sleep(2.0)
    idle = {n: (read() - idle0[n]) / 2.0 for n, read in readers.items()}  # CPU seconds per second, idle
    spies = []
    if profile is not None:
        spies = spy({n: p for n, p in pids.items() if n in ("serve", "daemon")}, 8, profile)
    cpu0 = {n: read() for n, read in readers.items()}
    got = load(url, key, model, args.streams, rounds, tokens, args.client_procs)
    for s in spies:
        s.wait()
    used = {n: read() - cpu0[n] for n, read in readers.items()}
    used["clients"] = got.pop("client_cpu_s")
    n = max(1, got["tokens"])
    got["us_per_token"] = {k: round(1e6 * v / n, 1) for k, v in used.items()}
    got["cores"] = {k: round(v / got["wall_s"], 2) for k, v in used.items()}
    got["idle_cpu_s_per_s"] = {k: round(v, 3) for k, v in idle.items()}
    got["cpu_s"] = used
    return got


def spy(pids: dict[str, int], seconds: float, out: Path) -> list[subprocess.Popen]:
    """py-spy records each process for `seconds`, only samples holding the GIL (what it computes), raw."""
    out.mkdir(parents=True, exist_ok=True)
    exe = str(Path(sys.executable).parent / "py-spy")
    return [subprocess.Popen([exe, "record", "--gil", "-r", "200", "-d", str(int(seconds)), "-f", "raw", "-o",
                              str(out / f"{name}.txt"), "-p", str(pid)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for name, pid in pids.items()]


def split(long: dict, short: dict) -> dict[str, dict[str, float]]:
    """Each process's CPU as a cost per request plus a cost per token, from two runs (idle CPU out)."""
    out = {}
    for name, idle in long["idle_cpu_s_per_s"].items():
        cpu = [r["cpu_s"][name] - idle * r["wall_s"] for r in (long, short)]
        (r1, t1), (r2, t2) = [(r["requests"], r["tokens"]) for r in (long, short)]
        det = r1 * t2 - r2 * t1
        if not det:
            continue
        per_request = (cpu[0] * t2 - cpu[1] * t1) / det
        per_token = (r1 * cpu[1] - r2 * cpu[0]) / det
        out[name] = {"us_per_request": round(1e6 * per_request, 1), "us_per_token": round(1e6 * per_token, 1)}
    return out


def fixed_cost_line(costs: dict[str, dict[str, float]], goal_us: float = 1000.0) -> str:
    """A request's fixed CPU in all (serve, the daemon and, where measured, PostgreSQL's server) against
    the goal."""
    parts = [name for name in ("serve", "daemon", "postgres") if name in costs]
    total = sum(costs[name]["us_per_request"] for name in parts)
    verdict = "met" if total <= goal_us else f"over the goal of {goal_us:,.0f}"
    each = " + ".join(str(costs[name]["us_per_request"]) for name in parts)
    return f"a request's fixed CPU in all ({' + '.join(parts)}): {each} = {total:,.1f} µs ({verdict})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slots", type=int, default=1024)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--split", type=int, default=None, metavar="TOKENS",
                        help="also run the fsched arm with requests of this many tokens, and split each "
                             "process's CPU into per request and per token")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct arm")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="py-spy records serve and the daemon over the fsched arm's first seconds "
                             "(samples holding the GIL; top frames printed)")
    args = parser.parse_args()
    from online_path import Fsched

    rows = []
    with Engine(args.slots, args.step_ms) as engine:
        if not args.no_direct:
            load(engine.url, "none", "paced-engine", 8, 1, 8, 1)  # warm-up
            direct = measured(engine.url, "none", "paced-engine", {"engine": engine.proc.pid}, args,
                              args.tokens, args.rounds)
            rows.append({"arm": "direct", **direct})
            print(json.dumps(rows[-1], default=str), flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            f = Fsched(engine, args.backend, Path(tmp), 1, link=True)
            try:
                pids = {"serve": f.servers[0].pid, "daemon": f.daemon.pid, "engine": engine.proc.pid}
                load(f.urls[0], f.key, "fsched", 8, 1, 8, 1)  # warm-up
                profile = Path(args.profile) if args.profile else None
                postgres = args.backend == "postgresql"
                through = measured(f.urls[0], f.key, "fsched", pids, args, args.tokens, args.rounds, profile,
                                   postgres)
                rows.append({"arm": "fsched", "backend": args.backend, **through})
                print(json.dumps(rows[-1], default=str), flush=True)
                if args.split:
                    rounds = max(1, round(args.rounds * args.tokens / args.split))
                    short = measured(f.urls[0], f.key, "fsched", pids, args, args.split, rounds,
                                     postgres=postgres)
                    rows.append({"arm": f"fsched {args.split} tokens", "backend": args.backend, **short})
                    print(json.dumps(rows[-1], default=str), flush=True)
                    costs = split(through, short)
                    print(json.dumps({"split": costs}), flush=True)
            finally:
                f.close()
    print(f"\n{args.streams} streams x {args.rounds} requests of {args.tokens} tokens (paced engine: "
          f"{args.slots} slots x {args.step_ms:g} ms), {args.client_procs} client processes")
    print("| arm | tok/s | TTFT p50 / p99 ms | errors | µs/token serve | daemon | engine | clients "
          "| postgres | cores serve, daemon | one core's tok/s serve, daemon |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        us, cores = r["us_per_token"], r["cores"]
        figs = " | ".join(str(us.get(name, "-"))
                          for name in ("serve", "daemon", "engine", "clients", "postgres"))
        caps = ", ".join(f"{1e6 / us[name]:,.0f}" if us.get(name) else "-" for name in ("serve", "daemon"))
        print(f"| {r['arm']} | {r['tok_s']:,.0f} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['errors']} | "
              f"{figs} | {cores.get('serve', '-')}, {cores.get('daemon', '-')} | {caps} |")
    if args.split:
        print("\n| process | µs per request | µs per token |\n|---|---|---|")
        for name, c in costs.items():
            print(f"| {name} | {c['us_per_request']} | {c['us_per_token']} |")
        print("\n" + fixed_cost_line(costs))
    if args.profile:
        from online_path import top_frames

        for path in sorted(Path(args.profile).glob("*.txt")):
            print(f"\n{path.name}:\n" + "\n".join(top_frames(path, 15)))


if __name__ == "__main__":
    main()
