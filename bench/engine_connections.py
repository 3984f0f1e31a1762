"""What a kept engine connection saves a request: fsched's own stream reader (core/runners/streams.py)
driving an engine's front end with kept connections against a new connection a request, in one run.

    .venv/bin/python bench/engine_connections.py [--engine vllm|paced] [--requests 400]
        [--concurrency 8] [--tokens 4] [--reps 3]

`--engine vllm`: vLLM's CPU build on the tiny model, started once with
`--tokens-only` (its session at nice 10, as bench/remote_engine.py starts it),
driven over `/inference/v1/generate` as the daemon drives it;
`--engine paced`: the paced stand-in (tests/support/paced_engine.py, 20 ms a
step) over `/v1/completions`. The client is `Streams` itself, in this
process: `--requests` greedy requests of `--tokens` tokens (`ignore_eos`,
token-id prompts), `--concurrency` open at a time, each opened as the
runner opens one. Arms alternate, `--reps` times each: `kept` (connections
kept between requests, the default) and `new` (none kept: a connection a
request, as before). Per run: requests a second, the CPU per request of
the engine's front-end process (vLLM's API server; the paced engine's whole
process) and of this process (the daemon's side: socket, connect, close,
the request's bytes and the answer's parse), and how many answers came on a
kept connection. Short answers make a request's fixed cost most of what is
measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fast_path import Engine, cpu_s, own_cpu_s  # noqa: E402

from fsched.core.runners import streams as streams_module  # noqa: E402
from fsched.core.runners.streams import Streams  # noqa: E402


def body(engine: str, model: str, n: int, tokens: int) -> dict:
    prompt = [11 + n % 50, 12, 13, 14]
    if engine == "vllm":
        return {"model": model, "token_ids": prompt, "stream": True, "sampling_params": {
            "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True, "detokenize": False}}
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "stream": True,
            "return_token_ids": True, "ignore_eos": True}


def run(streams: Streams, engine: str, model: str, requests: int, concurrency: int, tokens: int) -> dict:
    """`requests` streams, `concurrency` open at a time, each opened as the last one ends."""
    sent, got, failed, open_ = 0, 0, [], set()
    start = time.perf_counter()
    while sent < requests or open_:
        while sent < requests and len(open_) < concurrency:
            stream = streams.open(body(engine, model, sent, tokens))
            sent += 1
            if stream.ended:
                failed.append(stream.error)
            else:
                open_.add(stream)
        for stream in streams.poll(1.0):
            got += len(stream.take()[0])
            if stream.ended:
                open_.discard(stream)
                if stream.error:
                    failed.append(stream.error)
    return {"wall_s": time.perf_counter() - start, "tokens": got, "errors": len(failed),
            "error": failed[0] if failed else None}


def measure(arm: str, target, engine: str, model: str, args) -> dict:
    streams_module.IDLE_MAX = 1024 if arm == "kept" else 0  # none kept: a new connection a request
    streams = Streams(target.host, target.port, target.path)
    front0, own0 = target.front_cpu_s(), own_cpu_s()
    got = run(streams, engine, model, args.requests, args.concurrency, args.tokens)
    front, own = target.front_cpu_s() - front0, own_cpu_s() - own0
    reused = streams.connections_reused
    streams.close()
    n = args.requests
    return {"arm": arm, "req_s": round(n / got["wall_s"], 1),
            "front_us_per_request": round(1e6 * front / n, 1),
            "client_us_per_request": round(1e6 * own / n, 1), "answers_on_kept": reused,
            "tokens": got["tokens"], "errors": got["errors"], "error": got["error"]}


class _Paced:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.host, self.port, self.path = "127.0.0.1", int(engine.url.rsplit(":", 1)[1]), "/v1/completions"

    def front_cpu_s(self) -> float:
        return cpu_s(self.engine.proc.pid)


class _Vllm:
    def __init__(self, server):
        self.server = server
        self.host, self.port, self.path = "127.0.0.1", server.port, "/inference/v1/generate"

    def front_cpu_s(self) -> float:
        return cpu_s(self.server.proc.pid)  # the API server process (the engine core is its child)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "paced"], default="vllm")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows = []
    if args.engine == "vllm":
        from remote_engine import VllmServer, ensure_tiny_model  # torch and transformers: here only

        log = Path(tempfile.gettempdir()) / "engine_connections-vllm.log"
        extra = ("--max-num-seqs", str(max(8, args.concurrency)), "--tokens-only")
        with VllmServer(Path(ensure_tiny_model()), log, extra=extra, nice=10) as server:
            import httpx

            model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
            rows = alternate(_Vllm(server), "vllm", model, args)
    else:
        with Engine(256, 20.0) as engine:
            rows = alternate(_Paced(engine), "paced", "paced-engine", args)
    for arm in ("new", "kept"):
        mine = [r for r in rows if r["arm"] == arm]
        print(f"{arm}: engine front end µs/request {[r['front_us_per_request'] for r in mine]} "
              f"(median {statistics.median(r['front_us_per_request'] for r in mine):.1f}), client "
              f"{[r['client_us_per_request'] for r in mine]} (median "
              f"{statistics.median(r['client_us_per_request'] for r in mine):.1f}), requests/s "
              f"{[r['req_s'] for r in mine]}")


def alternate(target, engine: str, model: str, args) -> list[dict]:
    measure("kept", target, engine, model, argparse.Namespace(**{**vars(args), "requests": 16}))  # warm-up
    rows = []
    for rep in range(args.reps):
        for arm in (("new", "kept") if rep % 2 == 0 else ("kept", "new")):
            rows.append(measure(arm, target, engine, model, args))
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
