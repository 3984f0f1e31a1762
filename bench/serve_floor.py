"""What `fsched serve` spends a streamed request against the HTTP server under it alone.

    .venv/bin/python bench/serve_floor.py [--streams 64] [--rounds 60] [--tokens 4] [--reps 2]

Two arms under the same light client (bench/light_client.py: keep-alive
connections, each sending its next streamed chat request when the last ends),
measured in turn, `--reps` times each:
- `floor`: uvicorn with the protocol and loop `fsched serve` runs on (httptools, uvloop) and a bare ASGI app
  that reads the body, decodes its JSON and answers a stream of `--tokens` content chunks, the usage chunk
  and `[DONE]` at once: the HTTP server's own cost of a request, no table, no daemon;
- `serve`: `fsched serve` with its daemon in front of the paced engine (tests/support/paced_engine.py, one
  token a slot every 20 ms) on a fresh SQLite table: the whole server.
Per run: the server process's CPU (all its threads, /proc) per request; at the end each arm's median and
serve's over the floor's. Short answers keep a request's own cost most of what each server spends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import online_path  # noqa: E402
from fast_path import Engine  # noqa: E402
from light_client import chat_request, connect  # noqa: E402


def _chunk(fields: dict) -> bytes:
    text = json.dumps({"id": "chatcmpl-floor", "object": "chat.completion.chunk", **fields},
                      separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def bare_app(tokens: int):
    """An ASGI app answering every POST with a whole stream of `tokens` content chunks, at once."""
    content = _chunk({"choices": [{"index": 0, "delta": {"content": "token"}, "finish_reason": None}]})
    ending = _chunk({"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": tokens,
                                               "total_tokens": 6 + tokens}}) + b"data: [DONE]\n\n"

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        json.loads(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for _ in range(tokens):
            await send({"type": "http.response.body", "body": content, "more_body": True})
        await send({"type": "http.response.body", "body": ending, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def _serve_bare(port: int, tokens: int) -> None:
    import uvicorn

    uvicorn.run(bare_app(tokens), host="127.0.0.1", port=port, log_level="warning", access_log=False,
                http="httptools", loop="uvloop")


async def _drive(url: str, key: str, model: str, streams: int, rounds: int, tokens: int) -> int:
    request = chat_request(url, key, model, tokens)
    conns = [await connect(url) for _ in range(streams)]

    async def one(conn) -> int:
        done = 0
        for _ in range(rounds):
            got, _first = await conn.start(request)
            done += got == tokens
        return done

    try:
        return sum(await asyncio.gather(*(one(c) for c in conns)))
    finally:
        for conn in conns:
            conn.transport.close()


def cpu_s(pid: int) -> float:
    """The process's run time so far, all its threads (ns-precise: /proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
    return total / 1e9


def _wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def measured(pid: int, url: str, key: str, model: str, args) -> dict:
    """The server's CPU per request over the load, after a warm-up of a few rounds."""
    asyncio.run(_drive(url, key, model, 8, 4, args.tokens))
    before, began = cpu_s(pid), time.perf_counter()
    complete = asyncio.run(_drive(url, key, model, args.streams, args.rounds, args.tokens))
    wall = time.perf_counter() - began
    requests = args.streams * args.rounds
    if complete != requests:
        raise SystemExit(f"only {complete} of {requests} answers came whole")
    return {"us_per_request": round((cpu_s(pid) - before) / requests * 1e6, 1), "requests": requests,
            "wall_s": round(wall, 2)}


def floor_run(args) -> dict:
    port = online_path.free_port()
    server = multiprocessing.Process(target=_serve_bare, args=(port, args.tokens), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_listening(port)
        return measured(server.pid, url, "none", "floor", args)
    finally:
        server.terminate()
        server.join(10)


def serve_run(engine: Engine, args) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        f = online_path.Fsched(engine, "sqlite", Path(folder), 1, link=True)
        try:
            return measured(f.servers[0].pid, f.urls[0], f.key, "fsched", args)
        finally:
            f.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"floor": [], "serve": []}
    with Engine(max(256, args.streams), 20) as engine:
        for rep in range(args.reps):
            for arm in ("floor", "serve") if rep % 2 == 0 else ("serve", "floor"):
                row = floor_run(args) if arm == "floor" else serve_run(engine, args)
                runs[arm].append(row["us_per_request"])
                print(json.dumps({"arm": arm, "rep": rep, **row}), flush=True)
    floor, serve = statistics.median(runs["floor"]), statistics.median(runs["serve"])
    print(f"\n{args.streams} streams x {args.rounds} streamed chat requests of {args.tokens} tokens, "
          f"{args.reps} runs an arm (median)")
    print("| arm | server CPU µs a request | runs |\n|---|---|---|")
    print(f"| HTTP server alone (uvicorn, httptools, uvloop; a bare app) | {floor:,.1f} | {runs['floor']} |")
    print(f"| fsched serve | {serve:,.1f} | {runs['serve']} |")
    print(f"\nserve / the HTTP server alone: {serve / floor:.2f}x; the HTTP server is "
          f"{100 * floor / serve:.0f}% of serve's CPU a request")


if __name__ == "__main__":
    main()
