"""fsched over a real vLLM server (CPU build) against vLLM alone, on the tiny model.

    .venv/bin/python bench/remote_engine.py [throughput] [latency] [fairness] [prefix]

throughput  the same requests (prompts 16-128 tokens, outputs 8-128, greedy) sent
            straight to vLLM's HTTP API at a concurrency of --batch, against
            `fsched submit` + a running `fsched daemon --engine URL --max-batch
            --batch` (from the submit command to the last result stored):
            tokens/s of each and their ratio (goal >= 0.9).
latency     vLLM started with `--scheduling-policy priority --max-num-seqs 8`, its
            batch full of long batch work; 20 realtime requests arrive one by one:
            first-token p50/p99 sent straight to vLLM with a better priority
            (0 against 10), and through fsched (batch job, then realtime jobs);
            goal fsched p99 <= 1/5 of vLLM's.
fairness    tenants weighted 3:1, both backlogged, through fsched: the daemon's
            served share of the dominant resource, and the split of the tokens
            stored over the same window (goal 75% +- 5%).
prefix      what a resume costs: first-token time of prompt + generated tokens sent
            again right after (the engine's prefix cache holds them) against a
            fresh context of the same length.
vLLM runs in its own environment (scripts/vllm_env.sh). Prints one JSON line per case.

The engine runs at a lower CPU priority (--engine-nice, default 10, set on its
whole session) in every case and both arms. vLLM's CPU build keeps both of
this machine's cores busy polling; at equal priority it starves whichever
client drives it, fsched's daemon or the bare client alike, for up to seconds
at a time (measured: a 10 ms sleep in the client's session overshooting by
545 ms, a single 10 ms queue wait taking 3.1 s), which is not what a GPU box
does, where the engine computes on the GPU and the host has cores to spare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fsched.core.runners.hf.model import encode_prompt, ensure_tiny_model  # noqa: E402
from fsched.core.runners.hf.tokenizer import load_tokenizer  # noqa: E402
from fsched.core.runners.openai_http import EngineClient  # noqa: E402
from tests.support.vllm_server import VllmServer  # noqa: E402

FSCHED = str(Path(sys.executable).parent / "fsched")
WORDS = (
    "the fair queue serves every tenant its share of tokens while realtime chat waits less and "
    "batch work fills what is left of the engine"
).split()


def workload(tok, n: int, seed: int = 0, out=(8, 128), prompt=(16, 128)) -> list[dict]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        want = rng.randint(*prompt)
        text = " ".join(rng.choices(WORDS, k=want))
        while len(encode_prompt(tok, text)) > want:
            text = text.rsplit(" ", 1)[0]
        lines.append(
            {"custom_id": f"r{i}", "prompt": text, "max_tokens": rng.randint(*out), "temperature": 0}
        )
    return lines


# -- straight to the engine ----------------------------------------------------------------
def send(client: EngineClient, model: str, ids: list[int], max_tokens: int, priority: int | None = None):
    """One streamed completion: (first-token seconds, tokens)."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    if priority is not None:
        body["priority"] = priority
    streams = client.streams()
    start = time.perf_counter()
    stream = streams.open(body)
    first, tokens = None, []
    while not stream.ended:
        streams.poll(1.0)
        if stream.tokens and first is None:
            first = time.perf_counter() - start
        tokens += stream.take()[0]
    if stream.error:
        raise RuntimeError(stream.error)
    return first, tokens


def bare_throughput(client, model, requests: list[tuple[list[int], int]], concurrency: int) -> dict:
    todo = list(enumerate(requests))
    lock, total = threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                _, (ids, m) = todo.pop(0)
            _, tokens = send(client, model, ids, m)
            with lock:
                total[0] += len(tokens)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"tokens": total[0], "wall_s": round(wall, 2), "tok_s": round(total[0] / wall, 1)}


# -- through fsched ---------------------------------------------------------------------------
class Table:
    def __init__(self, folder: Path):
        self.db = folder / "fsched.db"
        self.folder = folder
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")},
            "FSCHED_DB": f"sqlite:///{self.db}",
            "USER": "bench",
            "LOGNAME": "bench",
        }
        self.files = 0

    def fsched(self, *args: str) -> None:
        subprocess.run([FSCHED, *args], env=self.env, check=True, capture_output=True)

    def submit(self, lines: list[dict], *args: str) -> None:
        self.files += 1
        path = self.folder / f"job{self.files}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        self.fsched("submit", str(path), *args)

    def daemon(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [FSCHED, "daemon", "--quiet", *args],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def query(self, sql: str) -> list[tuple]:
        if not self.db.exists():
            return []
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def wait(self, sql: str, until, timeout_s: float = 900, every: float = 0.05):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            rows = self.query(sql)
            if rows and until(rows[0]):
                return rows[0]
            time.sleep(every)
        raise TimeoutError(sql)


def stop(d: subprocess.Popen) -> None:
    d.send_signal(signal.SIGTERM)
    d.communicate(timeout=60)


def fsched_throughput(url: str, folder: Path, lines: list[dict], batch: int, tmp: Path) -> dict:
    table = Table(tmp)
    table.fsched("tenants", "add", "bench")  # creates the table
    d = table.daemon("--model", str(folder), "--engine", url, "--max-batch", str(batch))
    try:
        table.wait("SELECT COUNT(*) FROM daemons", lambda r: r[0] > 0, 120)
        time.sleep(1.0)
        start = time.perf_counter()
        table.submit(lines)
        table.wait("SELECT COUNT(*) FROM requests WHERE state != 'done'", lambda r: r[0] == 0)
        wall = time.perf_counter() - start
    finally:
        stop(d)
    tokens, first, last = table.query(
        "SELECT SUM(num_output_tokens), MIN(enqueued_at), MAX(finished_at) FROM requests"
    )[0]
    # Also from the moment the job was stored: what the submit command's own start-up
    # (a Python process, slow on a loaded machine) does not count in.
    return {
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tok_s": round(tokens / wall, 1),
        "stored_to_done_s": round(last - first, 2),
        "tok_s_from_stored": round(tokens / (last - first), 1),
    }


def case_throughput(args, tok, folder: Path, tmp: Path) -> dict:
    lines = workload(tok, args.requests)
    with VllmServer(folder, tmp / "vllm-throughput.log", extra=("--max-num-seqs", str(args.batch)),
                    nice=args.engine_nice) as server:
        client = EngineClient(server.url)
        model = client.info().model
        reqs = [(encode_prompt(tok, x["prompt"]), x["max_tokens"]) for x in lines]
        send(client, model, reqs[0][0], 4)  # warm-up
        bare = bare_throughput(client, model, reqs, args.batch)
        through = fsched_throughput(server.url, folder, lines, args.batch, tmp / "tp")
    return {
        "ratio_from_stored": round(through["tok_s_from_stored"] / bare["tok_s"], 3),
        "case": "throughput",
        "requests": len(lines),
        "concurrency": args.batch,
        "bare_vllm": bare,
        "fsched": through,
        "ratio": round(through["tok_s"] / bare["tok_s"], 3),
    }


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def latency_bare(client, model: str, tok, batch_lines: list[dict], chats: list[dict]) -> list[float]:
    """Straight to vLLM: batch work at priority 10, realtime at 0 (lower is served first)."""

    def encoded(x):
        return encode_prompt(tok, x["prompt"])

    background = [
        threading.Thread(target=send, args=(client, model, encoded(x), x["max_tokens"], 10), daemon=True)
        for x in batch_lines
    ]
    for t in background:
        t.start()
    time.sleep(3.0)  # the batch is full
    ttfts = []
    for x in chats:
        ttft, _ = send(client, model, encoded(x), x["max_tokens"], 0)
        ttfts.append(ttft)
        time.sleep(0.2)
    return ttfts  # the batch work still running is dropped by the server's restart


def latency_fsched(server, folder: Path, batch_lines: list[dict], chats: list[dict], tmp: Path):
    """Through fsched: the batch job first, then realtime jobs one by one (first token - enqueued)."""
    table = Table(tmp)
    table.fsched("tenants", "add", "a")
    table.fsched("tenants", "add", "b")
    table.submit(batch_lines, "-t", "a")
    d = table.daemon("--model", str(folder), "--engine", server.url, "--max-batch", "8")
    try:
        table.wait("SELECT COUNT(*) FROM requests WHERE first_token_at IS NOT NULL", lambda r: r[0] >= 8)
        time.sleep(1.0)
        for i, x in enumerate(chats):
            table.submit([x], "-t", "b", "--class", "realtime")
            done = f"SELECT COUNT(*) FROM requests WHERE custom_id = 'c{i}' AND state = 'done'"
            table.wait(done, lambda r: r[0] == 1, 300)
        rows = table.query("SELECT first_token_at - enqueued_at FROM requests WHERE custom_id LIKE 'c%'")
        left = table.query("SELECT COUNT(*) FROM requests WHERE custom_id LIKE 'b%' AND state != 'done'")
    finally:
        stop(d)
    return [r[0] for r in rows], left[0][0]


def case_latency(args, tok, folder: Path, tmp: Path) -> dict:
    rng = random.Random(7)  # distinct prompts: the prefix cache then serves resumes only
    batch_lines = [
        {
            "custom_id": f"b{i}",
            "prompt": " ".join(rng.choices(WORDS, k=24)),
            "max_tokens": 400,
            "temperature": 0,
        }
        for i in range(160)  # enough that the batch stays full until the last realtime request
    ]
    chats = [
        {"custom_id": f"c{i}", "prompt": " ".join(rng.choices(WORDS, k=8)), "max_tokens": 8, "temperature": 0}
        for i in range(20)
    ]
    extra = ("--scheduling-policy", "priority", "--max-num-seqs", "8")
    with VllmServer(folder, tmp / "vllm-latency.log", extra=extra, nice=args.engine_nice) as server:
        client = EngineClient(server.url)
        bare = latency_bare(client, client.info().model, tok, batch_lines, chats)
        server.restart()  # nothing left over from the bare run
        before = server.metrics()
        through, batch_left = latency_fsched(server, folder, batch_lines, chats, tmp / "lat")
        after = server.metrics()

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    return {
        "case": "latency",
        "realtime": len(chats),
        "batch_left_at_end": batch_left,
        "bare_vllm_priority_ms": {"p50": round(1000 * pct(bare, 0.5)), "p99": round(1000 * pct(bare, 0.99))},
        "fsched_ms": {"p50": round(1000 * pct(through, 0.5)), "p99": round(1000 * pct(through, 0.99))},
        "p99_ratio": round(pct(through, 0.99) / pct(bare, 0.99), 3),
        "fsched_prefix_cache_hit_tokens": delta("vllm:prefix_cache_hits_total"),
        "fsched_prefix_cache_query_tokens": delta("vllm:prefix_cache_queries_total"),
    }


def case_fairness(args, tok, folder: Path, tmp: Path) -> dict:
    extra = ("--max-num-seqs", "16")
    with VllmServer(folder, tmp / "vllm-fair.log", extra=extra, nice=args.engine_nice) as server:
        table = Table(tmp / "fair")
        table.fsched("tenants", "add", "heavy", "--weight", "3")
        table.fsched("tenants", "add", "light", "--weight", "1")
        table.submit(workload(tok, 900, seed=2, out=(16, 64), prompt=(16, 64)), "-t", "heavy")
        table.submit(workload(tok, 300, seed=3, out=(16, 64), prompt=(16, 64)), "-t", "light")
        d = table.daemon("--model", str(folder), "--engine", server.url, "--max-batch", "16")
        shares, window = [], []
        try:
            deadline = time.time() + args.fair_s + 30
            while time.time() < deadline and len(shares) < args.fair_s // 2:
                time.sleep(2.0)
                left = table.query("SELECT num_requests - num_done, num_output_tokens FROM jobs ORDER BY id")
                if min(x[0] for x in left) <= 16:
                    break
                stats = table.query("SELECT stats FROM daemons")
                share = json.loads(stats[0][0]).get("served_share", {}) if stats else {}
                if sum(x[1] for x in left) > 1500 and "heavy" in share:
                    shares.append(share["heavy"])
                    window.append((left[0][1], left[1][1]))
        finally:
            stop(d)
    heavy, light = window[-1][0] - window[0][0], window[-1][1] - window[0][1]
    return {
        "case": "fairness",
        "samples": len(shares),
        "served_share_heavy": shares,
        "mean": round(statistics.mean(shares), 4),
        "stored_tokens_split": round(heavy / (heavy + light), 4),
    }


def case_prefix(args, tok, folder: Path, tmp: Path) -> dict:
    rng = random.Random(5)
    with VllmServer(folder, tmp / "vllm-prefix.log", nice=args.engine_nice) as server:
        client = EngineClient(server.url)
        model = client.info().model
        hit, miss = [], []
        for _ in range(10):
            ids = [rng.randrange(3, 1900) for _ in range(600)]
            _, out = send(client, model, ids, 100)  # the request before its preemption
            ttft, _ = send(client, model, ids + out, 4)  # its resume: the prefix is cached
            hit.append(ttft)
            fresh = [rng.randrange(3, 1900) for _ in range(len(ids) + len(out))]
            ttft, _ = send(client, model, fresh, 4)  # the same length, nothing cached
            miss.append(ttft)
    return {
        "case": "prefix",
        "context_tokens": 700,
        "resume_ttft_ms": round(1000 * statistics.median(hit), 1),
        "fresh_ttft_ms": round(1000 * statistics.median(miss), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["throughput", "latency", "fairness", "prefix"])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--fair-s", type=int, default=20)
    parser.add_argument(
        "--engine-nice", type=int, default=10,
        help="CPU nice of the vLLM server's session, the same in both arms (0: none); see the module doc",
    )
    args = parser.parse_args()
    folder = ensure_tiny_model()
    tok = load_tokenizer(str(folder))
    cases = {
        "throughput": case_throughput,
        "latency": case_latency,
        "fairness": case_fairness,
        "prefix": case_prefix,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases:
            (Path(tmp) / name).mkdir()
            for sub in ("tp", "lat", "fair"):
                (Path(tmp) / name / sub).mkdir()
            print(json.dumps(cases[name](args, tok, folder, Path(tmp) / name)), flush=True)


if __name__ == "__main__":
    main()
