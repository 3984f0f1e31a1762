"""Benchmarks of `fsched serve`: real server and daemon processes, real HTTP clients.

    .venv/bin/python bench/http_api.py [first_token] [loaded] [concurrent] [upload]

first_token  the tiny model (then the stand-in, which takes no CPU to speak of, to
             show the path alone), requests one at a time: first token as an HTTP
             streaming client sees it, as `fsched generate`'s path sees it
             (submit a one-line job, poll every 20 ms, in this process: no
             interpreter start counted), and the daemon's own stamp (first
             token - enqueued, from the row); p50/p99 and what HTTP adds over
             the stamp (goal <= 25 ms at p50).
loaded       the tiny model, the batch full of another tenant's batch work;
             realtime requests over HTTP one by one: first-token p50/p99
             (goal p99 <= 500 ms).
concurrent   the stand-in model: 200 streaming clients at once (twice):
             errors (goal 0), requests/s, the server's CPU seconds per request.
upload       a 50,000-line batch file uploaded and its batch created (the
             whole file validated and stored) with the openai SDK (goal <= 15 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

# The test suite's server fixtures are reused: the repository goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402
import openai  # noqa: E402

from tests.acceptance.http_server import Server, make_server  # noqa: E402

CHAT = [{"role": "user", "content": "tell me about the fair queue"}]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summary(name: str, values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return f"{name:<34} p50 {pct(ms, 50):8.1f} ms   p99 {pct(ms, 99):8.1f} ms   (n={len(ms)})"


# One client for every request, as an application keeps one: a new httpx client builds an SSL
# context (tens of ms on a loaded machine) that would be counted as the server's.
CLIENT = httpx.Client(timeout=60)


def stream_first_token(url: str, key: str, max_tokens: int = 8, tier: str = "priority") -> tuple[float, int]:
    """Seconds from sending to the first chunk with text or a finish reason; the job id.

    A token may end inside a multi-byte character, which is held back until the
    next one completes it: with `max_tokens` 1 the first token is also the last,
    so the time measures the path alone, whatever the token's bytes.
    """
    body = {"model": "m", "messages": CHAT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "service_tier": tier}
    start = time.perf_counter()
    first = None
    job_id = None
    with CLIENT.stream("POST", f"{url}/v1/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {key}"}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            job_id = int(data["id"].split("-")[1])
            choice = data["choices"][0] if data["choices"] else {}
            if first is None and (choice.get("delta", {}).get("content") or choice.get("finish_reason")):
                first = time.perf_counter() - start
    return first, job_id


def stamp_ttft(server: Server, job_id: int) -> float:
    ((first, enqueued),) = server.rows(
        "SELECT first_token_at, enqueued_at FROM requests WHERE job_id = ?", job_id)
    return first - enqueued


def generate_path_ttft(db_url: str, n: int, max_tokens: int) -> list[float]:
    """`fsched generate`'s path in this process: a one-line job submitted, its row polled every 20 ms,
    until it shows text or has ended."""
    from fsched.cli.generate import POLL_S, one_line_job
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission
    from fsched.core.types import RequestClass
    from fsched.storage.jobstore import SqlJobStore

    store = SqlJobStore(db_url)
    out = []
    for _ in range(n):
        parsed = parse_job_file(one_line_job("tell me about the fair queue", max_tokens, 0.0, None), "<gen>")
        start = time.perf_counter()
        (job,) = store.submit([JobSubmission(parsed, "gen", RequestClass.REALTIME, 5, "generate")])
        while True:
            (p,) = store.request_progress(job.job_id)
            if p.output_text.rstrip("\ufffd") or p.state.finished:
                out.append(time.perf_counter() - start)
                break
            time.sleep(POLL_S)
        while not store.request_progress(job.job_id)[0].state.finished:
            time.sleep(POLL_S)
        time.sleep(0.05)
    store.db.dispose()
    return out


def tiny_server(root: Path, model_cache: str, *daemon_args: str) -> Server:
    s = make_server(root, model_cache)
    s.key("warmup")  # creates the table as this user (its admin)
    s.start_daemon(*daemon_args)
    s.start_server()
    s.wait_ready(timeout=600)
    return s


def bench_first_token(root: Path, model_cache: str, n: int, model: str | None = None) -> None:
    """On the tiny model (`model` None) or, to see the path without a model's CPU use, the stand-in."""
    s = tiny_server(root / f"first-{model}", model_cache, *(("--model", model) if model else ()))
    try:
        key = s.key("http", "realtime")
        for _ in range(3):
            stream_first_token(s.url, key)  # warm up both processes
        print(f"== first_token ({model or 'tiny model'}, one request at a time)")
        for max_tokens, what in ((1, "the only token: the path alone"), (8, "first visible text")):
            http, stamps = [], []
            for _ in range(n):
                first, job_id = stream_first_token(s.url, key, max_tokens)
                http.append(first)
                stamps.append(stamp_ttft(s, job_id))
                time.sleep(0.05)
            generated = generate_path_ttft(s.env["FSCHED_DB"], n, max_tokens)
            print(f"-- max_tokens {max_tokens} ({what})")
            print(summary("daemon stamp (first - enqueued)", stamps))
            print(summary("fsched generate path (20 ms poll)", generated))
            print(summary("HTTP streaming client", http))
            print(summary("HTTP minus the daemon stamp", [h - t for h, t in zip(http, stamps, strict=True)]))
    finally:
        s.stop()


def bench_loaded(root: Path, model_cache: str, n: int) -> None:
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission
    from fsched.core.types import RequestClass
    from fsched.storage.jobstore import SqlJobStore

    s = tiny_server(root / "loaded", model_cache)
    try:
        key = s.key("chat", "realtime")
        lines = "".join(json.dumps({"prompt": "the batch tenant fills the queue " * 4, "max_tokens": 256,
                                    "temperature": 0}) + "\n" for _ in range(400))
        store = SqlJobStore(s.env["FSCHED_DB"])
        store.submit([JobSubmission(parse_job_file(lines.encode(), "bulk"), "bulk", RequestClass.BATCH, 5,
                                    "bulk")])
        time.sleep(5)  # the batch fills
        firsts = []
        for _ in range(n):
            firsts.append(stream_first_token(s.url, key)[0])
            time.sleep(0.2)
        daemon = json.loads(s.cli("status", "--json"))["daemons"][0]["stats"]
        print(f"== loaded (tiny model, batch of {daemon.get('batch')} with 400 batch requests queued; "
              f"step {daemon.get('step_ms')} ms)")
        print(summary("realtime first token over HTTP", firsts))
        store.db.dispose()
    finally:
        s.stop()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_stream(client: httpx.AsyncClient, url: str, key: str) -> bool:
    body = {"model": "m", "messages": CHAT, "max_tokens": 32, "stream": True}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            return False
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    return lines[-1] == "data: [DONE]" and '"error"' not in "".join(lines)


async def many_streams(url: str, keys: list[str], n: int) -> list:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(one_stream(client, url, keys[i % len(keys)]) for i in range(n)),
                                    return_exceptions=True)


def bench_concurrent(root: Path, n: int, rounds: int) -> None:
    s = make_server(root / "concurrent")
    s.key("warmup")
    s.start_daemon("--model", "standin:1ms", "--max-batch", "64")
    s.start_server()
    s.wait_ready()
    try:
        keys = [s.key(f"tenant{i}") for i in range(4)]
        server_pid = s.procs[1].pid
        asyncio.run(many_streams(s.url, keys, 8))  # warm up
        cpu0, start = cpu_seconds(server_pid), time.perf_counter()
        results = []
        for _ in range(rounds):
            results += asyncio.run(many_streams(s.url, keys, n))
        wall, cpu = time.perf_counter() - start, cpu_seconds(server_pid) - cpu0
        errors = [r for r in results if r is not True]
        print(f"== concurrent (stand-in 1 ms a step, {rounds} x {n} streaming clients at once, "
              "32 tokens each)")
        print(f"errors {len(errors)} of {len(results)}" + (f": {errors[:3]}" if errors else ""))
        print(f"{len(results) / wall:.1f} requests/s over {wall:.1f} s; server CPU {cpu:.2f} s = "
              f"{cpu / len(results) * 1000:.1f} ms a request")
    finally:
        s.stop()


def bench_upload(root: Path, lines: int) -> None:
    s = make_server(root / "upload")
    s.key("warmup")
    s.start_daemon("--model", "standin")
    s.start_server()
    s.wait_ready()
    try:
        c = openai.OpenAI(api_key=s.key("uploader"), base_url=f"{s.url}/v1", max_retries=0, timeout=120)
        data = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"model": "m", "max_tokens": 16, "messages": [
                                       {"role": "user", "content": f"question number {i} about queues"}]}})
                       + "\n" for i in range(lines)).encode()
        start = time.perf_counter()
        uploaded = c.files.create(file=("big.jsonl", data), purpose="batch")
        uploaded_s = time.perf_counter() - start
        batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
        total = time.perf_counter() - start
        print(f"== upload ({lines:,} lines, {len(data) / 1e6:.1f} MB)")
        print(f"uploaded in {uploaded_s:.2f} s; batch {batch.status} with {batch.request_counts.total:,} "
              f"requests after {total:.2f} s in all")
        c.batches.cancel(batch.id)
    finally:
        s.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", nargs="*", default=["first_token", "loaded", "concurrent", "upload"])
    parser.add_argument("-n", type=int, default=40, help="requests for first_token and loaded")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        if "first_token" in args.which:
            bench_first_token(root, model_cache, args.n)
            bench_first_token(root, model_cache, args.n, "standin")
        if "loaded" in args.which:
            bench_loaded(root, model_cache, args.n)
        if "concurrent" in args.which:
            bench_concurrent(root, args.clients, args.rounds)
        if "upload" in args.which:
            bench_upload(root, args.lines)


if __name__ == "__main__":
    main()
