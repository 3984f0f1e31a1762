"""What fsched costs in front of an engine, against the engine's ideal client, in one run.

    .venv/bin/python bench/fast_path.py [relay] [--slots 1024 256] [--backends sqlite postgresql]

The engine is the paced stand-in (tests/support/paced_engine.py, its own
process): `--slots` streams at once, one token per stream every `--step-ms`
(20 ms: 50 tok/s a stream, slots x 50 tok/s in all), FCFS beyond the slots,
computing nothing, so every figure is fsched's cost or the engine's pace.

relay   a submitted job of `--requests` x `--tokens` (greedy, ignore_eos)
        through `fsched submit` + `fsched daemon --engine URL`, against the
        ideal client (asyncio, raw HTTP, `--slots` streams at once, the same
        request bodies the daemon sends) straight to the engine: tok/s of
        each and their ratio (from the job stored to its last request done,
        and from the submit command), the daemon's CPU per token (utime +
        stime of its process over the run, /proc/<pid>/stat) and the
        engine's; goal ratio >= 0.95 and <= 20 us per token at 51,200 tok/s.
online  (a hook: ARMS below) an OpenAI SDK client of streamed chat at
        several concurrencies, direct against through `fsched serve`.

Each (arm, slots, backend) prints one JSON line, then a table of them all.
PostgreSQL: a fresh database on FSCHED_TEST_PG's server (default
postgresql+psycopg://postgres@127.0.0.1:5432/test), dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fsched.core.runners.remote import completion_body  # noqa: E402
from fsched.core.runners.standin import standin_encode  # noqa: E402
from fsched.core.types import SamplingParams  # noqa: E402
from tests.support import ideal_client  # noqa: E402

FSCHED = str(Path(sys.executable).parent / "fsched")
PG_ADMIN = os.environ.get("FSCHED_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu_s() -> float:
    """CPU seconds this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def processes_with(field: int, value: int) -> list[int]:
    """The processes whose `field` of /proc/PID/stat (counted after the command's name: 1 the parent,
    3 the session) is `value`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text() if proc.name.isdigit() else None
            if stat is not None and int(stat.rsplit(")", 1)[1].split()[field]) == value:
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return processes_with(1, pid)


def postgres_cpu_s() -> float:
    """CPU seconds used so far by this machine's PostgreSQL server processes (0 where none runs)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "postgres":
                total += cpu_s(int(proc.name))
        except OSError:
            continue
    return total


# -- the engine ---------------------------------------------------------------------------------
class Engine:
    """The paced stand-in engine in its own process."""

    def __init__(self, slots: int, step_ms: float, stamps: Path | None = None, front: bool = False):
        """`stamps`: a folder where the engine notes when each request a client tagged reached it
        (core/stamps.py); `front`: its iterations also served through fsched's vLLM front (`front_url`)."""
        self.slots, self.step_ms = slots, step_ms
        env = {**os.environ, "FSCHED_STAMPS": str(stamps)} if stamps is not None else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.paced_engine", "--port", "0", "--slots", str(slots),
             "--step-ms", str(step_ms), *(["--front-port", "0"] if front else [])],
            cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
        self.url = self.proc.stdout.readline().strip()
        self.front_url = self.proc.stdout.readline().strip() if front else None

    @property
    def pace(self) -> float:
        """tok/s with every slot busy."""
        return self.slots * 1000 / self.step_ms

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


# -- the job table --------------------------------------------------------------------------------
class Table:
    """A fresh job table on one backend, and the fsched commands run against it."""

    def __init__(self, backend: str, folder: Path):
        self.backend, self.folder = backend, folder
        self.pg_name = None
        if backend == "sqlite":
            self.url = f"sqlite:///{folder / 'fsched.db'}"
        else:
            self.pg_name = f"fsched_bench_{uuid.uuid4().hex[:10]}"
            self._admin(f'CREATE DATABASE "{self.pg_name}"')
            self.url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{self.pg_name}"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")},
                    "FSCHED_DB": self.url, "USER": "bench", "LOGNAME": "bench"}
        from sqlalchemy import create_engine

        self.db = create_engine(self.url)

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(sql)

    def close(self) -> None:
        self.db.dispose()
        if self.pg_name:
            self._admin(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')

    def fsched(self, *args: str) -> None:
        subprocess.run([FSCHED, *args], env=self.env, check=True, capture_output=True)

    def query(self, sql: str) -> tuple:
        from sqlalchemy import text

        with self.db.connect() as conn:
            return tuple(conn.execute(text(sql)).one())

    def wait(self, sql: str, until: Callable[[tuple], bool], timeout_s: float = 600, every: float = 0.05):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = self.query(sql)
            if until(row):
                return row
            time.sleep(every)
        raise TimeoutError(sql)

    def daemon(self, *args: str) -> subprocess.Popen:
        """`fsched daemon` on this table, with `args` and then BENCH_DAEMON_ARGS (the environment's, split on
        spaces: an A/B of a daemon option across the benchmarks built on this table)."""
        extra = os.environ.get("BENCH_DAEMON_ARGS", "").split()
        return subprocess.Popen([FSCHED, "daemon", "--quiet", *args, *extra], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


# -- the relay arm -------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Workload:
    requests: int
    tokens: int

    def lines(self) -> list[dict]:
        return [{"custom_id": f"r{i}", "prompt": f"request {i} of the fast path", "max_tokens": self.tokens,
                 "temperature": 0, "ignore_eos": True} for i in range(self.requests)]

    def bodies(self, model: str) -> list[dict]:
        """What the daemon sends the engine for each line."""
        return [completion_body(model, standin_encode(x["prompt"]), SamplingParams(
            max_tokens=self.tokens, temperature=0.0, ignore_eos=True), 0, 8192) for x in self.lines()]


def ideal(engine: Engine, work: Workload) -> dict:
    before = cpu_s(engine.proc.pid)
    run = ideal_client.run(engine.url, work.bodies("paced-engine"), engine.slots)
    engine_cpu = cpu_s(engine.proc.pid) - before
    return {"tokens": run.total, "wall_s": round(run.wall_s, 2), "tok_s": round(run.tok_s),
            "engine_us_per_token": round(1e6 * engine_cpu / max(1, run.total), 1)}


def relay(engine: Engine, work: Workload, backend: str, tmp: Path, profile: Path | None = None) -> dict:
    """The job through `fsched submit` + `fsched daemon --engine URL`, the daemon's CPU over the run."""
    table = Table(backend, tmp)
    try:
        table.fsched("tenants", "add", "bench")  # creates the table
        job = tmp / "job.jsonl"
        job.write_text("".join(json.dumps(x) + "\n" for x in work.lines()))
        daemon = table.daemon("--model", "standin", "--engine", engine.url, "--max-batch", str(engine.slots))
        try:
            table.wait("SELECT COUNT(*) FROM daemons", lambda r: r[0] > 0, 120)
            time.sleep(1.0)
            spy = _profiler(daemon.pid, profile) if profile else None
            try:
                return _relay_run(table, engine, daemon, job)
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
                    print("\n".join(top_frames(profile)), flush=True)
        finally:
            daemon.terminate()
            daemon.communicate(timeout=60)
    finally:
        table.close()


def _relay_run(table: Table, engine: Engine, daemon: subprocess.Popen, job: Path) -> dict:
    cpu0, engine0, start = cpu_s(daemon.pid), cpu_s(engine.proc.pid), time.perf_counter()
    db0 = postgres_cpu_s()
    table.fsched("submit", str(job))
    table.wait("SELECT COUNT(*) FROM requests WHERE state NOT IN ('done', 'failed')", lambda r: r[0] == 0)
    wall = time.perf_counter() - start
    cpu, engine_cpu = cpu_s(daemon.pid) - cpu0, cpu_s(engine.proc.pid) - engine0
    db_cpu = postgres_cpu_s() - db0  # the server's processes (a PostgreSQL table; the table polls count too)
    tokens, first, last, failed, first_token = table.query(
        "SELECT SUM(num_output_tokens), MIN(enqueued_at), MAX(finished_at), "
        "SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END), MIN(first_token_at) FROM requests")
    return {"tokens": int(tokens), "failed": int(failed), "wall_s": round(wall, 2),
            "tok_s_from_submit": round(tokens / wall), "stored_to_done_s": round(last - first, 2),
            "stored_to_first_token_s": round(first_token - first, 2),
            "tok_s": round(tokens / (last - first)), "daemon_cpu_s": round(cpu, 2),
            "daemon_us_per_token": round(1e6 * cpu / tokens, 1),
            "engine_us_per_token": round(1e6 * engine_cpu / tokens, 1),
            "postgres_us_per_token": round(1e6 * db_cpu / tokens, 1)}


def _profiler(pid: int, out: Path) -> subprocess.Popen:
    """py-spy sampling `pid` (collapsed stacks to `out`) until it gets SIGINT; with PROFILE_IDLE set, the
    samples of waiting too (where the wall time goes, not only the CPU)."""
    spy = str(Path(sys.executable).parent / "py-spy")
    idle = ["--idle"] if os.environ.get("PROFILE_IDLE") else []
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
                             "--nonblocking", "--function", *idle, "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def top_frames(collapsed: Path, n: int = 25) -> list[str]:
    """The functions the samples were in (self) and under (total), most first, from collapsed stacks."""
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, k = stack.split(";"), int(count)
        total += k
        own[frames[-1]] = own.get(frames[-1], 0) + k
        for frame in set(frames):
            under[frame] = under.get(frame, 0) + k
    out = [f"{collapsed.name}: {total} samples; self% total% function"]
    for frame, k in sorted(own.items(), key=lambda x: -x[1])[:n]:
        out.append(f"  {100 * k / total:5.1f} {100 * under[frame] / total:5.1f}  {frame}")
    return out


def relay_arm(args, slots: int, backends: list[str]) -> list[dict]:
    work = Workload(args.requests, args.tokens)
    rows = []
    with Engine(slots, args.step_ms) as engine:
        base = ideal(engine, work)
        for backend in backends:
            with tempfile.TemporaryDirectory() as tmp:
                profile = args.profile / f"relay-{slots}-{backend}.txt" if args.profile else None
                through = relay(engine, work, backend, Path(tmp), profile)
            rows.append({"arm": "relay", "slots": slots, "pace_tok_s": round(engine.pace), "backend": backend,
                         "ideal": base, "fsched": through,
                         "ratio": round(through["tok_s"] / base["tok_s"], 3),
                         "ratio_from_submit": round(through["tok_s_from_submit"] / base["tok_s"], 3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# -- the online arm (a hook) -------------------------------------------------------------------------
def online_arm(args, slots: int, backends: list[str]) -> list[dict]:
    """Streamed chat through the OpenAI SDK at several concurrencies, direct and through `fsched serve`:
    rows of {"arm": "online", "slots", "backend", "concurrency", "direct": {...}, "fsched": {...}}."""
    raise NotImplementedError("the online arm is not written yet")


ARMS: dict[str, Callable[[argparse.Namespace, int, list[str]], list[dict]]] = {
    "relay": relay_arm,
    "online": online_arm,
}


def table_lines(rows: list[dict]) -> list[str]:
    """The relay rows as a Markdown table."""
    out = ["| slots (tok/s) | backend | ideal tok/s | fsched tok/s | ratio | from submit | daemon µs/token |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["arm"] == "relay":
            out.append(f"| {r['slots']} ({r['pace_tok_s']:,}) | {r['backend']} | {r['ideal']['tok_s']:,} | "
                       f"{r['fsched']['tok_s']:,} | {r['ratio']:.3f}x | {r['ratio_from_submit']:.3f}x | "
                       f"{r['fsched']['daemon_us_per_token']} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arms", nargs="*", default=["relay"], help=f"of {sorted(ARMS)}")
    parser.add_argument("--slots", type=int, nargs="+", default=[1024, 256])
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--profile", type=Path, default=None,
                        help="a folder: sample the daemon with py-spy (collapsed stacks) and print its top "
                             "frames; the figures of a profiled run count py-spy's pauses too")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    for arm in args.arms:
        for slots in args.slots:
            rows += ARMS[arm](args, slots, args.backends)
    print("\n".join(table_lines(rows)))


if __name__ == "__main__":
    main()
