"""What an online request pays for going through fsched: the `openai` SDK direct to an engine against
the same client through `fsched serve` + `fsched daemon --engine URL`, in one run.

    .venv/bin/python bench/online_path.py [--concurrency 1 8 32 128 256] [--backends sqlite postgresql]
        [--replicas 1 2] [--workers N] [--loaded] [--no-link] [--profile DIR] [--stamps [DIR]]
        [--vllm [--engine-nice 10]] [--arrivals closed|poisson [--seed 0]] [--repeat N] [--client sdk|light]
        [--paced-front]

The engine is the paced stand-in (tests/support/paced_engine.py, its own
process: `--slots` streams at once, one token each every `--step-ms`). The
client (its own process, this one) is AsyncOpenAI: streamed chat,
`--tokens` tokens (temperature 0, ignore_eos), `--rounds` x concurrency
requests at each concurrency, `concurrency` of them open at a time. Per
arm: tok/s (content chunks / wall time), TTFT p50 and p99 (request sent to
first content chunk). fsched: serve and daemon in separate processes, over
a fresh table on each backend; `--replicas 2` puts two `fsched serve` behind
one table, the clients alternating between them. Each arm first sends a few
short requests (4 streams, 8 requests of 8 tokens) that are not measured: a
fresh server's first request pays once for its key's read and the first run
of its code (about 7 ms more than the next ones on SQLite, 16 on PostgreSQL,
measured one request at a time), which otherwise fell in the first
concurrency's row and, with 16 requests, was its p99. `--workers N`: each server
runs N worker processes on its one port (`fsched serve --workers N`; serve's
CPU is then its workers'). `--loaded`: another
tenant's batch job fills the engine first (twice its slots in requests of
about 100 s of tokens each, at most 8,000) and the client's key is
realtime; its TTFT is compared with the idle direct engine's.
`--arrivals poisson`: an open loop instead of `concurrency` clients each
sending its next request when its last one ends: the `rounds` x concurrency
requests are sent at the times of a Poisson process (seeded by `--seed` and
the concurrency, the same times in every arm) whose rate keeps `concurrency`
requests open on average (Little's law: `concurrency` over a request's
`tokens` + 1.5 engine iterations), as requests from many users arrive. A
closed loop locks each client's next request to the engine iteration that
ended its last one, so a few milliseconds more on the way round decide
whether it waits for the next iteration (a whole `--step-ms`) or not;
arrivals at random times meet the iterations at random phases either way.
`--repeat N`: every arm measured N times in turn (the direct arm, then
fsched's; vLLM started again each time), each row printed, and at the end
each arm's median and range over the repeats: one run on a shared 2-core
machine moves by tens of percent (in one run the direct arm in front of vLLM
streamed 1,396 tok/s before one table's arms and 1,718 before the other's).
`--client light`: bench/light_client.py's raw asyncio client instead of the SDK, in every arm (a
keep-alive connection a stream, no JSON decoded but the usage chunk): the SDK spends 220-265 µs of the
client's CPU a chunk, so at 128 streams of a 20 ms engine (6,400 chunks a second) the one SDK process
needs more than the machine's two cores and the load measures the client, with or without fsched.
`--paced-front`: the daemon reads the paced engine through fsched's vLLM front (the engine serves
its iterations through core/runners/vllm_front.py's server too, as vLLM's engine core behind
`fsched vllm-front`); the direct client still streams over HTTP.
`--no-link`: the daemons publish no link (servers read the table only): the
path as it was. `--stamps`: each online request's stages timed (core/stamps.py: the client's
send, request read, handler start, its group commit's transaction begun and ended, row stored, announced,
the claim's transaction begun, claimed, its engine request sent, first token read,
pushed, received, written, the client's first content read), a row per concurrency of each stage's
p50 / p99, and at the end a table of where the first token's time went (ms p50: the client's way in,
direct and through fsched; fsched's stages in; the engine's first token; the way out), and one of each
row's largest burst of ends (answers the daemon read from one engine iteration) and the requests that
followed it, stage by stage in ms after the daemon read the burst's first end (first / p50 / last):
whether the next requests reached the engine before its next iteration (`burst_timeline`).
`--profile DIR`: py-spy records serve and daemon during the highest concurrency (top frames printed);
environment: SPY_RATE (samples a second, 200), SPY_SECONDS (8), SPY_ALL=1 (threads not holding the GIL too).

`--vllm`: the engine is vLLM's CPU build serving the tiny model (started
once, as bench/remote_engine.py starts it, its session at `--engine-nice`;
`--max-num-seqs` and the daemon's `--max-batch` are the highest
concurrency). The direct arm is measured again before each backend's
fsched arm (the machine's two cores are shared with vLLM, and a baseline
measured minutes earlier drifts). Rows add, in each arm, the CPU per token of vLLM
(its whole session), of the client (this process) and of the machine's
PostgreSQL server, and the machine's busy cores over the load (every
process's, /proc/stat); the TTFT p50 ratio; the CPU daemon and servers use
idle (ms per second, over 2 s before the load).

With `--vllm`, the token-interface arm follows (`--engine-apis`, default
all three): vLLM is started again with `--tokens-only` (its API server loads no
tokenizer and detokenizes nothing) and fsched's daemon drives it with
`--engine-api tokens`; then the front's arm: vLLM's engine core behind
fsched's own front (core/runners/vllm_front.py) instead of vLLM's API
server, the daemon at `--engine front://...`. Every vLLM row adds the CPU
per token of the engine's front end alone (vLLM's API server process, or
the front; the engine core is another process), and the last table sets,
per arm, fsched's CPU (serve + daemon) and the front end's beside vLLM's
API server's alone in the direct arm of the same run, with the whole
stack's ratio: (fsched + front end) / API server alone.

Goal: tok/s >= 0.95x direct, TTFT p50 <= direct + 15 ms, p99 <= direct + 40 ms; under another tenant's
full batch (`--loaded`), TTFT p50 <= the idle direct engine's + 40 ms, p99 + 100 ms. In front of vLLM:
tok/s >= 0.9x direct, TTFT p50 <= 1.2x direct. The table's last column holds each row to its goal: `met`,
or each figure past its bound.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fast_path import (  # noqa: E402
    FSCHED,
    TICK,
    Engine,
    Table,
    children,
    cpu_s,
    own_cpu_s,
    postgres_cpu_s,
    processes_with,
)

from fsched.core.stamps import TAG_HEADER  # noqa: E402

MESSAGES = [{"role": "user", "content": "tell me about fair scheduling"}]
BATCH_TOKENS_MAX = 8_000  # a --loaded batch request's tokens at most (the paced engine's context: 8,192)
TAGS = itertools.count()  # the client's numbers for its requests (--stamps), unique in a run
ARM_RUNS = itertools.count()  # the fsched arms run so far (--stamps: a folder each)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the client --------------------------------------------------------------------------------
async def _one(client, model: str, tokens: int, ttfts: list[float], times: list | None = None) -> int:
    """One streamed chat; with `times`, its (tag, wall time sent, wall time of its first content) added,
    the tag sent in core/stamps.py's header for the server to stamp with its job."""
    headers = mine = None
    if times is not None:
        mine = [next(TAGS), time.time(), None]
        headers = {TAG_HEADER: str(mine[0])}
        times.append(mine)
    start = time.perf_counter()
    got = 0
    stream = await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, extra_headers=headers)
    usage = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not got:
                ttfts.append(time.perf_counter() - start)
                if mine is not None:
                    mine[2] = time.time()
            got += 1
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return usage if usage is not None else got  # a chunk may carry several tokens


async def _load(urls: list[str], key: str, model: str, concurrency: int, requests: int, tokens: int,
                tagged: bool = False, offsets: list[float] | None = None) -> dict:
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    clients = [AsyncOpenAI(base_url=f"{u}/v1", api_key=key, max_retries=0, timeout=120,
                           http_client=httpx.AsyncClient(limits=limits, timeout=120)) for u in urls]
    ttfts: list[float] = []
    times = [] if tagged else None

    async def one(index: int) -> int:
        return await _one(clients[index % len(clients)], model, tokens, ttfts, times)

    results, wall = await _driven(one, concurrency, requests, offsets)
    for c in clients:
        await c.close()
    return _figures(results, wall, ttfts, times)


async def _driven(one, concurrency: int, requests: int, offsets: list[float] | None) -> tuple[list, float]:
    """`requests` calls of `one(index)` (index: the caller's stream, which picks its server): by
    `concurrency` streams, each sending its next as its last ends (closed loop), or each at its offset
    from the start (open loop); their results (or exceptions) and the wall time."""
    queue = list(range(requests))

    async def worker(index: int) -> int:
        got = 0
        while queue:
            queue.pop()
            got += await one(index)
        return got

    async def sent_at(index: int, offset: float) -> int:  # an open loop's request, at its time
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        return await one(index)

    start = time.perf_counter()
    calls = (worker(i) for i in range(concurrency)) if offsets is None else (
        sent_at(i, offset) for i, offset in enumerate(offsets))
    results = await asyncio.gather(*calls, return_exceptions=True)
    return results, time.perf_counter() - start


async def _light_load(urls: list[str], key: str, model: str, concurrency: int, requests: int, tokens: int,
                      tagged: bool = False, offsets: list[float] | None = None) -> dict:
    """`_load` with bench/light_client.py's client: a keep-alive connection a stream (closed loop) or an
    idle one taken from a pool, else a new one (open loop); the same figures."""
    from light_client import chat_request, connect

    ttfts: list[float] = []
    times = [] if tagged else None
    idle: dict[str, list] = {u: [] for u in urls}
    plain = {u: chat_request(u, key, model, tokens) for u in urls}

    async def one(index: int) -> int:
        url = urls[index % len(urls)]
        while idle[url] and idle[url][-1].closed:  # past the server's keep-alive timeout
            idle[url].pop()
        stream = idle[url].pop() if idle[url] else await connect(url)
        request = plain[url]
        if times is not None:
            mine = [next(TAGS), time.time(), None]
            times.append(mine)
            request = chat_request(url, key, model, tokens, {TAG_HEADER: str(mine[0])})
        got, first = await stream.start(request)
        idle[url].append(stream)
        if first is not None:
            ttfts.append(first)
            if times is not None:
                mine[2] = mine[1] + first
        return got

    results, wall = await _driven(one, concurrency, requests, offsets)
    for streams in idle.values():
        for stream in streams:
            stream.transport.close()
    return _figures(results, wall, ttfts, times)


def _figures(results: list, wall: float, ttfts: list[float], times: list | None) -> dict:
    errors = [r for r in results if isinstance(r, BaseException)]
    total = sum(r for r in results if isinstance(r, int))
    ttfts.sort()
    return {"tokens": total, "errors": len(errors), "error": repr(errors[0])[:200] if errors else None,
            "wall_s": round(wall, 2), "tok_s": round(total / wall, 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1) if ttfts else None,
            "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1)
            if ttfts else None, **({"client_times": times} if times is not None else {})}


def load(urls, key, model, concurrency, rounds, tokens, tagged: bool = False,
         offsets: list[float] | None = None, client: str = "sdk") -> dict:
    """The load's figures; `tagged`: its requests tagged for the stamps, and `client_times` added (each
    request's tag, wall time sent, wall time of its first content); `offsets`: an open loop, each
    request sent at its offset (s) from the start (`poisson_offsets`); `client`: "sdk" (the `openai`
    SDK) or "light" (bench/light_client.py)."""
    requests = len(offsets) if offsets is not None else max(16, rounds * concurrency)
    run = _light_load if client == "light" else _load
    return asyncio.run(run(urls, key, model, concurrency, requests, tokens, tagged, offsets))


def poisson_offsets(args, concurrency: int) -> list[float] | None:
    """An open loop's send times (`--arrivals poisson`), None for the closed loop: `rounds` x concurrency
    requests at the rate that keeps `concurrency` of them open on average, the same for every arm."""
    if args.arrivals == "closed":
        return None
    import random

    draw = random.Random(args.seed * 1_000_003 + concurrency)
    rate = concurrency / ((args.tokens + 1.5) * args.step_ms / 1000)
    at, offsets = 0.0, []
    for _ in range(max(16, args.rounds * concurrency)):
        offsets.append(at)
        at += draw.expovariate(rate)
    return offsets


# -- fsched ----------------------------------------------------------------------------------------
class Fsched:
    """A table, a daemon in front of the engine, and `replicas` servers."""

    def __init__(self, engine: Engine | Vllm, backend: str, folder: Path, replicas: int, link: bool,
                 stamps: Path | None = None, workers: int = 1):
        self.table = Table(backend, folder)
        if stamps is not None:  # every process notes each online request's stages (core/stamps.py)
            stamps.mkdir(parents=True, exist_ok=True)
            self.table.env["FSCHED_STAMPS"] = str(stamps)
        self.procs: list[subprocess.Popen] = []
        self.table.fsched("tenants", "add", "bench")  # creates the table
        self.key = self._key("bench")
        model = engine.folder if isinstance(engine, Vllm) else "standin"
        api = ["--engine-api", engine.engine_api] if isinstance(engine, Vllm) else []
        # the paced engine through fsched's vLLM front, where the run asks for it (--paced-front)
        url = engine.front_url or engine.url if isinstance(engine, Engine) else engine.url
        self.daemon = self.table.daemon("--model", model, "--engine", url, "--max-batch",
                                        str(engine.slots), *api, *([] if link else ["--link", "off"]))
        self.procs.append(self.daemon)
        self.ports = [free_port() for _ in range(replicas)]
        self.workers = workers
        self.servers = [subprocess.Popen([FSCHED, "serve", "--port", str(p), "--no-access-log",
                                          "--workers", str(workers)],
                                         env=self.table.env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL) for p in self.ports]
        self.procs += self.servers
        self._ready()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def server_pids(self) -> dict[str, int]:
        """Each server's process, or with `--workers` each of its workers (the supervisor does no work)."""
        if self.workers == 1:
            return {f"serve{i}": s.pid for i, s in enumerate(self.servers)}
        return {f"serve{i}.w{j}": pid for i, s in enumerate(self.servers)
                for j, pid in enumerate(sorted(children(s.pid)))}

    def _key(self, tenant: str) -> str:
        from fsched.core.types import RequestClass
        from fsched.storage.sql_keys import SqlKeyStore

        keys = SqlKeyStore(self.table.url)
        try:
            return keys.create_key(tenant, RequestClass.REALTIME)[1]
        finally:
            keys.db.dispose()

    def _ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 120
        for url in self.urls:
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).json().get("daemons_alive"):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("fsched did not come up")
                time.sleep(0.1)
        time.sleep(1.5)  # the servers link to the daemon (every 0.5 s)

    def served_model(self) -> str:
        """The model name the servers list (the daemon's)."""
        import httpx

        got = httpx.get(f"{self.urls[0]}/v1/models", headers={"Authorization": f"Bearer {self.key}"},
                        timeout=10).json()
        return got["data"][0]["id"]

    def fill_with_batch(self, slots: int, tokens: int) -> None:
        """Another tenant's batch job, more requests than the engine has slots, long enough to last."""
        job = self.table.folder / "batch.jsonl"
        job.write_text("".join(json.dumps({"custom_id": f"b{i}", "prompt": f"batch {i}", "max_tokens": tokens,
                                           "temperature": 0, "ignore_eos": True}) + "\n"
                               for i in range(2 * slots)))
        self.table.fsched("tenants", "add", "other")
        self.table.fsched("submit", str(job), "--tenant", "other")
        self.table.wait("SELECT COUNT(*) FROM requests WHERE state = 'running'", lambda r: r[0] >= slots, 120)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.table.close()


def profile(pids: dict[str, int], seconds: float, out: Path) -> subprocess.Popen:
    """py-spy records each process for `seconds`, raw (collapsed stacks), only samples holding the GIL
    (what the process computes, not what its threads wait on)."""
    out.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    rate = os.environ.get("SPY_RATE", "200")  # samples a second
    gil = [] if os.environ.get("SPY_ALL") else ["--gil"]  # SPY_ALL=1: threads off the GIL too (system calls)
    seconds = float(os.environ.get("SPY_SECONDS", seconds))
    return [subprocess.Popen([spy, "record", *gil, "-r", rate, "-d", str(int(seconds)), "-f", "raw", "-o",
                              str(out / f"{name}.txt"), "-p", str(pid)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for name, pid in pids.items()]


def top_frames(path: Path, n: int = 12) -> list[str]:
    """The functions most samples were in (self time), from py-spy's collapsed stacks."""
    counts: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.split(";")[-1]
        counts[leaf] = counts.get(leaf, 0) + int(count)
        total += int(count)
    return [f"{100 * c / total:5.1f}% {f}" for f, c in sorted(counts.items(), key=lambda x: -x[1])[:n]]


# -- vLLM ------------------------------------------------------------------------------------------
class Vllm:
    """vLLM's CPU build serving the tiny model (its chat template in the folder), `slots` sequences at
    once, its session's CPU priority lowered to `nice` (bench/remote_engine.py says why)."""

    def __init__(self, slots: int, nice: int, log: Path, engine_api: str = "completions"):
        import httpx
        from remote_engine import VllmServer, ensure_tiny_model  # torch and transformers: here only

        from fsched.core.runners.front_link import FrontClient
        from tests.support.vllm_server import VllmFront

        self.slots = slots
        # How fsched's daemon drives it: "tokens": started --tokens-only; "front": fsched's front for
        # vLLM's engine core instead of vLLM's API server (the engine core the same).
        self.engine_api = engine_api
        self.folder = str(ensure_tiny_model())
        extra = ("--max-num-seqs", str(slots), *(("--tokens-only",) if engine_api == "tokens" else ()))
        server_class = VllmFront if engine_api == "front" else VllmServer
        self.server = server_class(Path(self.folder), log, extra=extra, nice=nice)
        self.server.start()
        self.url = self.server.url
        try:
            self.model = (FrontClient(self.url).info().model if engine_api == "front" else
                          httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"])
        except BaseException:
            self.server.stop()
            raise

    def cpu_s(self) -> float:
        """CPU seconds used so far by the server's whole session (API server and engine core)."""
        total = 0.0
        for pid in processes_with(3, self.server.proc.pid):  # its session
            try:
                total += cpu_s(pid)
            except (OSError, ValueError, IndexError):  # ended meanwhile
                continue
        return total

    def api_cpu_s(self) -> float:
        """CPU seconds used so far by vLLM's API server process alone (or fsched's front in its place),
        not its engine core."""
        return cpu_s(self.server.proc.pid)

    def __enter__(self) -> Vllm:
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


def idle_cpu(pids: dict[str, int], seconds: float = 2.0) -> dict[str, float]:
    """CPU ms per second each process uses with nothing to do (its loops' idle passes), which a
    per-token figure at a few hundred tok/s also counts."""
    before = {n: cpu_s(p) for n, p in pids.items()}
    time.sleep(seconds)
    return {n: round(1000 * (cpu_s(p) - before[n]) / seconds, 1) for n, p in pids.items()}


def warm_up(urls: list[str], key: str, model: str) -> None:
    """A few short requests first: what a fresh server or engine does once is not measured."""
    asyncio.run(_load(urls, key, model, 4, 8, 8))


def measured(engine, urls: list[str], key: str, model: str, concurrency: int, rounds: int, tokens: int,
             tagged: bool = False, offsets: list[float] | None = None, client: str = "sdk") -> dict:
    """load(), with vLLM's CPU per token over it (its whole session) when the engine is vLLM."""
    if not isinstance(engine, Vllm):
        return load(urls, key, model, concurrency, rounds, tokens, tagged, offsets, client)
    before, client_cpu, db, busy = engine.cpu_s(), own_cpu_s(), postgres_cpu_s(), machine_busy_s()
    api = engine.api_cpu_s()
    got = load(urls, key, model, concurrency, rounds, tokens, tagged, offsets, client)
    n = max(1, got["tokens"])
    got["engine_us_per_token"] = round(1e6 * (engine.cpu_s() - before) / n, 1)
    got["api_server_us_per_token"] = round(1e6 * (engine.api_cpu_s() - api) / n, 1)
    got["client_us_per_token"] = round(1e6 * (own_cpu_s() - client_cpu) / n, 1)
    got["postgres_us_per_token"] = round(1e6 * (postgres_cpu_s() - db) / n, 1)
    got["machine_busy_cores"] = round((machine_busy_s() - busy) / got["wall_s"], 2)
    return got


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy so far (all cores, every process, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK  # less idle and iowait


def direct_arm(engine, args, stamps: Path | None = None) -> dict[int, dict]:
    """The client straight to the engine at each concurrency; with `stamps` (the paced engine's folder),
    its way there and back timed too (a row per concurrency)."""
    model = engine.model if isinstance(engine, Vllm) else "paced-engine"
    warm_up([engine.url], "none", model)
    direct = {}
    for c in args.concurrency:
        direct[c] = measured(engine, [engine.url], "none", model, c, args.rounds, args.tokens,
                             tagged=stamps is not None, offsets=poisson_offsets(args, c), client=args.client)
        times = direct[c].pop("client_times", None)
        print(json.dumps({"arm": "direct", "concurrency": c, **direct[c]}), flush=True)
        if stamps is not None:
            direct[c]["stages"] = client_figures(stamps, times)
            print(json.dumps({"arm": "direct stages", "concurrency": c, **direct[c]["stages"]}), flush=True)
    return direct


def client_figures(folder: Path, times: list) -> dict:
    """A direct client's requests (`times`: the load's `client_times`): sent → at the engine (the paced
    engine's stamps in `folder`) → its first content read, ms p50 / p99."""
    arrived = {}
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            stage, number, at = line.split()
            if stage == "client_engine_arrived":
                arrived[int(number)] = float(at)
    requests = client_stages(times)
    for number, stages in requests.items():
        if number in arrived:
            stages["client_engine_arrived"] = arrived[number]
    order = ("client_sent", "client_engine_arrived", "client_first")
    return {"requests": len(requests), "p50/p99 ms": spans(list(requests.values()), order)}


def client_stages(times: list) -> dict[int, dict[str, float]]:
    """The client's own stages of each request it tagged, by tag."""
    return {number: {"client_sent": sent, **({"client_first": first} if first else {})}
            for number, sent, first in times}


def _p50_p99(found: list[float]) -> str:
    found.sort()
    return f"{statistics.median(found):.1f}/{found[min(len(found) - 1, int(0.99 * len(found)))]:.1f}"


# -- the run -----------------------------------------------------------------------------------------
def fsched_arm(engine: Engine, args, backend: str, replicas: int, direct: dict[int, dict]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # A folder an arm's run: each run's table numbers its jobs from 1, so a --repeat's turns (or two
        # arms of one backend) sharing a folder would join one turn's stamps to another's jobs.
        stamps = None if args.stamps is None else \
            Path(args.stamps or tmp) / f"stamps-{backend}-{os.getpid()}-{next(ARM_RUNS)}"
        f = Fsched(engine, backend, Path(tmp), replicas, link=not args.no_link, stamps=stamps,
                   workers=args.workers)
        try:
            if args.loaded:
                # about 100 s of tokens, within the paced engine's context (8,192) at a faster pace
                f.fill_with_batch(engine.slots, min(int(100_000 // args.step_ms), BATCH_TOKENS_MAX))
            model = f.served_model() if isinstance(engine, Vllm) else "fsched"
            warm_up(f.urls, f.key, model)
            for c in args.concurrency:
                pids = {"daemon": f.daemon.pid, **f.server_pids()}
                idle = idle_cpu(pids) if isinstance(engine, Vllm) else None
                cpu0 = {n: cpu_s(p) for n, p in pids.items()}
                spies = []
                if args.profile and c == max(args.concurrency):
                    spies = profile(pids, 8, Path(args.profile) / f"{backend}-x{replicas}")
                began = time.time()
                through = measured(engine, f.urls, f.key, model, c, args.rounds, args.tokens,
                                   tagged=stamps is not None, offsets=poisson_offsets(args, c),
                                   client=args.client)
                times = through.pop("client_times", None)
                stages = None
                if stamps is not None:
                    stages = stage_figures(stamps, began, time.time(), times)
                    print(json.dumps({"arm": "stages", "backend": backend, "concurrency": c, **stages}),
                          flush=True)
                for spy in spies:
                    spy.wait()
                cpu = {n: round(1e6 * (cpu_s(p) - cpu0[n]) / max(1, through["tokens"]), 1)
                       for n, p in pids.items()}
                base = direct[c]
                row = {"arm": "online", "backend": backend, "replicas": replicas, "workers": args.workers,
                       "loaded": args.loaded,
                       "link": not args.no_link, "concurrency": c, "arrivals": args.arrivals,
                       "direct": base, "fsched": through,
                       "us_per_token": cpu, "ratio": round(through["tok_s"] / base["tok_s"], 3),
                       "ttft_p50_extra_ms": round(through["ttft_p50_ms"] - base["ttft_p50_ms"], 1),
                       "ttft_p99_extra_ms": round(through["ttft_p99_ms"] - base["ttft_p99_ms"], 1)}
                if stages is not None:
                    row["stages"] = stages
                if isinstance(engine, Vllm):
                    row["engine"] = "vllm"
                    row["engine_api"] = engine.engine_api
                    row["ttft_p50_ratio"] = round(through["ttft_p50_ms"] / base["ttft_p50_ms"], 3)
                    row["idle_cpu_ms_per_s"] = idle
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            f.close()
    return rows


STAGES = ("client_sent", "arrived", "handler", "grouped", "committed", "stored", "announced", "claim_began",
          "claimed", "opened", "sent", "read", "pushed", "received", "written", "client_first")
ENDS = ("end_read", "finished", "end_pushed", "end_received", "end_written")


def stage_figures(folder: Path, began: float, ended: float, client_times: list | None = None) -> dict:
    """From the stamps of core/stamps.py: for the online requests whose handler started between `began`
    and `ended`, each stage's time since the one before (ms, p50 / p99), and their end's way back (from
    the engine's last token read to the server's reading of the end). The client's own times (its request
    sent, its first content read: `client_times` of the load) join a job by the tag the server stamped
    with it."""
    seen: dict[int, dict[str, float]] = {}
    client = client_stages(client_times or [])
    tags: dict[int, int] = {}
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue
            if parts[0] == "tag":
                tags[int(parts[1])] = int(parts[2])
                continue
            stages = seen.setdefault(int(parts[1]), {})
            stages.setdefault(parts[0], float(parts[2]))  # the first time it reached the stage
    for job, number in tags.items():
        if job in seen:
            seen[job].update(client.get(number, {}))
    jobs = [s for s in seen.values() if began <= s.get("arrived", -1.0) <= ended]

    return {"requests": len(jobs), "p50/p99 ms": spans(jobs, STAGES), "end": spans(jobs, ENDS),
            "whole": spans(jobs, ("arrived", "written")), "way in": spans(jobs, ("arrived", "opened")),
            "client": spans(jobs, ("client_sent", "client_first")), "burst": burst_timeline(jobs)}


BURST_GAP_S = 0.005  # ends the daemon read this close together are one burst (one engine iteration's)
BURST_STAGES = ("end_pushed", "end_received", "end_written", "arrived", "committed", "claimed", "opened",
                "read", "written")


def burst_timeline(jobs: list[dict[str, float]]) -> dict:
    """The largest burst of ends (answers the daemon read from one engine iteration, within BURST_GAP_S of
    each other) and what followed it, ms after the burst's first end was read (first / p50 / last): the
    ends' way to their clients, then the requests that arrived from the burst's first end written until
    the next burst's first end was read (in a closed loop, mostly the burst's clients' next requests)
    through their stages to the engine and their first token. Where a closed loop's streams end in two
    iterations' turns, the next burst comes within the window: its requests are counted too."""
    ends = sorted(s["end_read"] for s in jobs if "end_read" in s)
    if not ends:
        return {}
    bursts, current = [], [ends[0]]
    for at in ends[1:]:
        if at - current[-1] > BURST_GAP_S:
            bursts.append(current)
            current = []
        current.append(at)
    bursts.append(current)
    index = max(range(len(bursts)), key=lambda i: len(bursts[i]))
    burst, start = bursts[index], bursts[index][0]
    until = bursts[index + 1][0] if index + 1 < len(bursts) else start + 1.0
    ended = [s for s in jobs if start <= s.get("end_read", -1.0) <= burst[-1]]
    first_written = min((s["end_written"] for s in ended if "end_written" in s), default=start)
    following = [s for s in jobs if first_written <= s.get("arrived", -1.0) < until]
    timeline = {}
    for stage in BURST_STAGES:
        group = ended if stage.startswith("end_") else following
        found = sorted(1000 * (s[stage] - start) for s in group if stage in s)
        if found:
            timeline[stage] = f"{found[0]:.1f}/{statistics.median(found):.1f}/{found[-1]:.1f}"
    return {"ends": len(burst), "next": len(following), "ms first/p50/last": timeline}


def spans(requests: list[dict[str, float]], order: tuple[str, ...]) -> dict[str, str]:
    """Each stage's time since the one before it that the request reached, ms p50 / p99 (a tree that
    stamps fewer stages gives fewer, longer spans)."""
    gaps: dict[str, list[float]] = {}
    for s in requests:
        reached = [stage for stage in order if stage in s]
        for before, after in zip(reached, reached[1:], strict=False):
            gaps.setdefault(f"{before}>{after}", []).append(1000 * (s[after] - s[before]))
    return {name: _p50_p99(found) for name, found in gaps.items()}


# What a row is held to. The paced engine idle: throughput over direct, the first token's p50 and p99 over
# direct (ms); under another tenant's full batch, the first token over the idle engine's (its throughput
# shares the engine with that batch: no bound). In front of vLLM: throughput, the first token's p50 ratio.
IDLE_GOAL = (0.95, 15.0, 40.0)
LOADED_GOAL = (None, 40.0, 100.0)
VLLM_GOAL = (0.9, 1.2)


def goal_misses(row: dict) -> list[str]:
    """What `row` misses of its goal (none: met), each as the figure against its bound."""
    if row.get("engine") == "vllm":
        least, most = VLLM_GOAL
        return ([f"tok/s {row['ratio']:.3g}x < {least}x"] if row["ratio"] < least else []) + (
            [f"TTFT p50 {row['ttft_p50_ratio']:.2f}x > {most}x"] if row["ttft_p50_ratio"] > most else [])
    least, p50, p99 = LOADED_GOAL if row["loaded"] else IDLE_GOAL
    misses = [f"tok/s {row['ratio']:.3g}x < {least}x"] if least is not None and row["ratio"] < least else []
    for name, bound in (("p50", p50), ("p99", p99)):
        if (extra := row[f"ttft_{name}_extra_ms"]) > bound:
            misses.append(f"TTFT {name} {extra:+.1f} > +{bound:.0f} ms")
    return misses


def table_lines(rows: list[dict]) -> list[str]:
    vllm = any(r.get("engine") == "vllm" for r in rows)
    out = ["| backend | serve x | load | c | direct tok/s | fsched tok/s | ratio | TTFT p50 direct → fsched "
           "| TTFT p99 direct → fsched | µs/token daemon, serve |"
           + (" TTFT p50 ratio | vLLM µs/token direct, fsched | client µs/token direct, fsched "
              "| busy cores direct, fsched |" if vllm else "") + " goal |",
           "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if vllm else "") + "---|"]
    for r in rows:
        d, f = r["direct"], r["fsched"]
        serve = sum(v for k, v in r["us_per_token"].items() if k.startswith("serve"))
        api = f" ({r['engine_api']})" if r.get("engine_api", "completions") != "completions" else ""
        out.append(f"| {r['backend']}{api} | {_servers(r)} | {'batch-filled' if r['loaded'] else 'idle'} | "
                   f"{_streams(r)} | {d['tok_s']:,.0f} | {f['tok_s']:,.0f} | {r['ratio']:.2f}x | "
                   f"{d['ttft_p50_ms']} → {f['ttft_p50_ms']} ms | "
                   f"{d['ttft_p99_ms']} → {f['ttft_p99_ms']} ms | "
                   f"{r['us_per_token']['daemon']}, {serve:.1f} |"
                   + (f" {r['ttft_p50_ratio']:.2f}x | "
                      f"{d['engine_us_per_token']}, {f['engine_us_per_token']} | "
                      f"{d['client_us_per_token']}, {f['client_us_per_token']} | "
                      f"{d['machine_busy_cores']}, {f['machine_busy_cores']} |" if vllm else "")
                   + f" {'; '.join(goal_misses(r)) or 'met'} |")
    return out


def _servers(row: dict) -> str:
    """A row's servers: replicas, and each one's workers when more than one."""
    workers = row.get("workers", 1)
    return f"{row['replicas']}" + (f" x {workers} workers" if workers > 1 else "")


def _streams(row: dict) -> str:
    """A row's concurrency, marked when its requests came by an open loop's Poisson arrivals."""
    return f"{row['concurrency']}" + (" (Poisson)" if row.get("arrivals") == "poisson" else "")


IN_STAGES = ("arrived>handler", "handler>grouped", "grouped>committed", "committed>stored",
             "stored>announced", "announced>claim_began", "claim_began>claimed", "claimed>opened",
             "opened>sent")


def stage_lines(rows: list[dict]) -> list[str]:
    """Where the first token's time went (--stamps), ms p50: the client's way in (its call to the engine
    direct, to the server's handler through fsched), fsched's stages from the head read to the engine,
    the engine's first token, the way back to the client's read; and fsched's whole part."""
    out = ["| backend | c | client's way in, direct → fsched | fsched in (head → engine) "
           "| engine's first token | fsched out → client's read "
           "| fsched head → first chunk written, p50 / p99 |",
           "|---|---|---|---|---|---|---|"]

    def p50(figures: dict, name: str) -> float | None:
        found = figures.get(name)
        return None if found is None else float(found.split("/")[0])

    for r in rows:
        if "stages" not in r:
            continue
        mine, direct = r["stages"]["p50/p99 ms"], r["direct"].get("stages", {}).get("p50/p99 ms", {})
        within = sum(p50(mine, name) or 0.0 for name in IN_STAGES)
        back = sum(p50(mine, name) or 0.0 for name in ("read>pushed", "pushed>received", "received>written",
                                                         "written>client_first"))
        way_in = f"{p50(direct, 'client_sent>client_engine_arrived')} → {p50(mine, 'client_sent>arrived')}"
        engine = p50(mine, "sent>read")
        out.append(f"| {r['backend']} | {_streams(r)} | {way_in} | {within:.1f} | {engine} | {back:.1f} "
                   f"| {r['stages']['whole'].get('arrived>written')} |")
    return out


def burst_lines(rows: list[dict]) -> list[str]:
    """--stamps: each row's largest burst of ends and what followed it (`burst_timeline`), ms after the
    daemon read the burst's first end, first / p50 / last."""
    out = ["| backend | c | ends, next | " + " | ".join(BURST_STAGES) + " |",
           "|---|---|---|" + "---|" * len(BURST_STAGES)]
    for r in rows:
        burst = r.get("stages", {}).get("burst")
        if not burst:
            continue
        cells = [burst["ms first/p50/last"].get(stage, "") for stage in BURST_STAGES]
        head = f"| {r['backend']} | {_streams(r)} | {burst['ends']}, {burst['next']} | "
        out.append(head + " | ".join(cells) + " |")
    return out


def interface_arm(args, directs: dict[str, dict[int, dict]], api: str) -> list[dict]:
    """fsched in front of vLLM over `api`: "tokens", vLLM started with --tokens-only, the daemon on its token
    interface; "front", fsched's front for vLLM's engine core in place of vLLM's API server. Each backend
    against the direct arm measured on that backend's turn (vLLM alone, its OpenAI API, this run)."""
    log = Path(tempfile.gettempdir()) / f"online_path-vllm-{api}-{os.getpid()}.log"
    print(f"vLLM's log ({api}): {log}", file=sys.stderr, flush=True)
    rows = []
    with Vllm(max(args.concurrency), args.engine_nice, log, engine_api=api) as engine:
        for backend in args.backends:
            for replicas in args.replicas:
                rows += fsched_arm(engine, args, backend, replicas, directs[backend])
    return rows


def stack_lines(rows: list[dict]) -> list[str]:
    """CPU per streamed token: fsched (serve + daemon) and the engine's front end (vLLM's API server, or
    fsched's front in its place), in each arm, beside vLLM's API server alone (the direct arm); the stack's
    ratio is (fsched + front end) / API server alone."""
    out = ["| backend | c | engine API | fsched µs/token (serve + daemon) | engine front end µs/token "
           "| vLLM API server alone µs/token | stack / vLLM alone | tok/s fsched / direct |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("engine") != "vllm":
            continue
        fsched = sum(r["us_per_token"].values())
        api, alone = r["fsched"]["api_server_us_per_token"], r["direct"]["api_server_us_per_token"]
        out.append(f"| {r['backend']} | {r['concurrency']} | {r['engine_api']} | {fsched:.1f} | {api} | "
                   f"{alone} | {(fsched + api) / max(alone, 1e-9):.2f}x | {r['ratio']:.2f}x |")
    return out


def summary_lines(rows: list[dict]) -> list[str]:
    """--repeat: each arm's figures over the repeats, median (lowest to highest): the ratio of throughput,
    the first token's p50 and p99 over direct (ms; with vLLM the p50's ratio), fsched's CPU per token and,
    in front of vLLM, the whole stack's ratio to vLLM alone."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["backend"], r.get("engine_api", ""), r["replicas"], r["loaded"], _streams(r))
        groups.setdefault(key, []).append(r)

    def spread(values: list[float], unit: str = "", digits: int = 1) -> str:
        return (f"{statistics.median(values):.{digits}f}{unit} "
                f"({min(values):.{digits}f} to {max(values):.{digits}f})")

    out = ["| backend | engine API | serve x | load | c | repeats | tok/s ratio | TTFT p50 extra ms "
           "(vLLM: ratio) | TTFT p99 extra ms | fsched µs/token | stack / vLLM alone |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (backend, api, replicas, loaded, streams), found in groups.items():
        vllm = found[0].get("engine") == "vllm"
        p50 = [r["ttft_p50_ratio"] if vllm else r["ttft_p50_extra_ms"] for r in found]
        cpu = [sum(r["us_per_token"].values()) for r in found]
        stack = [(sum(r["us_per_token"].values()) + r["fsched"]["api_server_us_per_token"])
                 / max(r["direct"]["api_server_us_per_token"], 1e-9) for r in found] if vllm else None
        out.append(f"| {backend} | {api or '-'} | {replicas} | {'batch-filled' if loaded else 'idle'} | "
                   f"{streams} | {len(found)} | {spread([r['ratio'] for r in found], 'x', 2)} | "
                   f"{spread(p50, 'x', 2) if vllm else spread(p50)} | "
                   f"{spread([r['ttft_p99_extra_ms'] for r in found])} | "
                   f"{spread(cpu)} | {spread(stack, 'x', 2) if stack else '-'} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1])
    parser.add_argument("--workers", type=int, default=1, help="each server's processes (its --workers)")
    parser.add_argument("--loaded", action="store_true")
    parser.add_argument("--no-link", action="store_true")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--stamps", nargs="?", const="", default=None, metavar="DIR",
                        help="each online request's stages timed (core/stamps.py), a row per concurrency; "
                             "the stamps kept in DIR if given")
    parser.add_argument("--vllm", action="store_true",
                        help="vLLM's CPU build on the tiny model instead of the paced stand-in")
    parser.add_argument("--engine-nice", type=int, default=10,
                        help="--vllm: CPU nice of vLLM's session (0: none), as in bench/remote_engine.py")
    parser.add_argument("--engine-apis", nargs="+", default=["completions", "tokens", "front"],
                        choices=["completions", "tokens", "front"],
                        help="--vllm: the daemon's engine interfaces measured (tokens: vLLM --tokens-only; "
                             "front: fsched's front for vLLM's engine core)")
    parser.add_argument("--paced-front", action="store_true",
                        help="the daemon drives the paced engine through fsched's vLLM front (the engine's "
                             "iterations served by core/runners/vllm_front.py's server) instead of its HTTP "
                             "API; the direct client still streams over HTTP")
    parser.add_argument("--arrivals", choices=["closed", "poisson"], default="closed",
                        help="closed: `concurrency` clients, each sending its next request as its last "
                             "ends; poisson: an open loop at the rate that keeps `concurrency` open")
    parser.add_argument("--seed", type=int, default=0, help="--arrivals poisson: the arrival times' seed")
    parser.add_argument("--client", choices=["sdk", "light"], default="sdk",
                        help="sdk: the openai SDK; light: bench/light_client.py's raw asyncio client, "
                             "which leaves the cores to the servers at high stream counts")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure every arm this many times in turn (direct, then fsched; with "
                             "--arrivals poisson the seed plus the repeat's number) and end with each "
                             "arm's medians")
    args = parser.parse_args()
    if args.vllm and args.loaded:
        parser.error("--loaded is for the paced engine only")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.vllm and args.arrivals != "closed":
        parser.error("--arrivals poisson needs the paced engine's pace (--step-ms) for its rate")
    rows = []
    for round_ in range(args.repeat):
        seeded = argparse.Namespace(**{**vars(args), "seed": args.seed + round_})
        mine = measure(seeded)
        rows += [{**r, "repeat": round_} for r in mine]
    print("\n".join(table_lines(rows)))
    if any("stages" in r for r in rows):
        print("\n" + "\n".join(stage_lines(rows)))
        print("\n" + "\n".join(burst_lines(rows)))
    if args.vllm:
        print("\n" + "\n".join(stack_lines(rows)))
    if args.repeat > 1:
        print("\n" + "\n".join(summary_lines(rows)))
    if args.profile:
        for path in sorted(Path(args.profile).rglob("*.txt")):
            print(f"\n{path.relative_to(args.profile)}:\n" + "\n".join(top_frames(path)))


def measure(args) -> list[dict]:
    """One measurement of every arm: the direct one, then fsched's (on each backend, each interface)."""
    rows = []
    if args.vllm:
        log = Path(tempfile.gettempdir()) / f"online_path-vllm-{os.getpid()}.log"
        print(f"vLLM's log: {log}", file=sys.stderr, flush=True)
        directs = {}
        with Vllm(max(args.concurrency), args.engine_nice, log) as engine:
            for backend in args.backends:
                direct = directs[backend] = direct_arm(engine, args)  # again before each arm: it drifts
                for replicas in args.replicas:
                    if "completions" in args.engine_apis:
                        rows += fsched_arm(engine, args, backend, replicas, direct)
        for api in ("tokens", "front"):
            if api in args.engine_apis:
                rows += interface_arm(args, directs, api)
    else:
        engine_stamps = None
        if args.stamps is not None:
            engine_stamps = Path(args.stamps or tempfile.mkdtemp()) / f"direct-{os.getpid()}"
            engine_stamps.mkdir(parents=True, exist_ok=True)  # (a --repeat's turns: tags stay unique)
        with Engine(args.slots, args.step_ms, engine_stamps, front=args.paced_front) as engine:
            direct = direct_arm(engine, args, engine_stamps)
            for backend in args.backends:
                for replicas in args.replicas:
                    rows += fsched_arm(engine, args, backend, replicas, direct)
    return rows


if __name__ == "__main__":
    main()
