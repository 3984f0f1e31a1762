"""CPU per streamed token of vLLM's front end over each way fsched could ask it for tokens, in one run.

    FSCHED_VLLM_PYTHON=... GRPC_OVERLAY=DIR python bench/engine_front_ends.py [--concurrency 32]
        [--requests 128] [--tokens 64] [--arms completions tokens grpc front]

Runs under vLLM's own environment's python (it re-executes itself there:
the gRPC client needs grpcio and the servicer's stubs). For each arm, vLLM's
CPU build serves the tiny model, its session at nice 10 (as in
bench/remote_engine.py), and a client with fsched's request shape streams
`--requests` greedy requests of `--tokens` tokens (`ignore_eos`), token-id
prompts, `--concurrency` at a time:
- `completions`: `python -m vllm.entrypoints.openai.api_server`, streamed
  `/v1/completions` with `return_token_ids` (what fsched sends by default);
- `tokens`: the same server with `--tokens-only`, streamed
  `/inference/v1/generate` (`detokenize: false`);
- `grpc`: `python -m vllm.entrypoints.launchers.grpc_server` (smg-grpc-servicer),
  the streamed `Generate` RPC with tokenized input. The servicer and its
  stubs are not installed in vLLM's environment: `GRPC_OVERLAY` names a
  folder holding them (`pip install --no-deps --target DIR smg-grpc-servicer
  smg-grpc-proto grpcio-health-checking grpcio-reflection` with vLLM's pip:
  grpcio and protobuf come with vLLM).
- `front`: fsched's front for vLLM's engine core (core/runners/vllm_front.py)
  in place of vLLM's API server, all the requests on one connection, in its
  lines.
Printed per arm: tok/s, and CPU µs per token of the front-end process alone
(the engine core is another process) and of the whole vLLM session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def session_cpu_s(sid: int) -> float:
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                    total += cpu_s(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
    return total


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One vLLM front end (what vLLM's python runs: `entry`) on a loopback port, its session at nice 10."""

    def __init__(self, entry: list[str], model: str, slots: int, extra: tuple[str, ...], log: Path,
                 env: dict):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, *entry, "--model", model, "--dtype", "float32", "--enforce-eager",
             "--gpu-memory-utilization", "0.3", "--max-num-seqs", str(slots), "--port", str(self.port),
             "--host", "127.0.0.1", *extra],
            env={**os.environ, **env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"},
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            Path(f"/proc/{self.proc.pid}/autogroup").write_text("10")
        except OSError:
            pass
        os.setpriority(os.PRIO_PROCESS, self.proc.pid, 10)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)


async def http_stream(host: str, port: int, path: str, body: dict) -> int:
    """Stream one request over raw HTTP/1.1; the token ids received."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    got = 0
    async for line in reader:
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            for choice in chunk.get("choices") or ():
                got += len(choice.get("token_ids") or ())
    writer.close()
    return got


def http_body(arm: str, prompt: list[int], tokens: int) -> tuple[str, dict]:
    if arm == "completions":
        return "/v1/completions", {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                                   "return_token_ids": True, "ignore_eos": True}
    return "/inference/v1/generate", {"token_ids": prompt, "stream": True, "sampling_params": {
        "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "detokenize": False}}


async def grpc_stream(stub, pb, prompt: list[int], tokens: int, index: int) -> int:
    request = pb.GenerateRequest(
        request_id=f"bench-{index}", tokenized=pb.TokenizedInput(input_ids=prompt), stream=True,
        sampling_params=pb.SamplingParams(temperature=0.0, top_p=1.0, max_tokens=tokens, ignore_eos=True,
                                          n=1))
    got = 0
    async for response in stub.Generate(request):
        if response.HasField("chunk"):
            got += len(response.chunk.token_ids)
    return got


async def front_load(port: int, prompts: list[list[int]], concurrency: int, tokens: int) -> int:
    """Every request through the front on one connection, `concurrency` open at a time; the tokens got."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(json.dumps({"hello": 1}).encode() + b"\n")
    await reader.readline()
    sampling = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True, "detokenize": False}
    sent = 0

    def add() -> None:
        nonlocal sent
        writer.write(json.dumps(["add", str(sent), {"token_ids": prompts[sent], "sampling_params": sampling}]
                                ).encode() + b"\n")
        sent += 1

    for _ in range(min(concurrency, len(prompts))):
        add()
    got = done = 0
    while done < len(prompts):
        for rid, new, finish, _, error in json.loads(await reader.readline()):
            if error is not None:
                raise RuntimeError(f"request {rid}: {error}")
            got += len(new)
            if finish is not None:
                done += 1
                if sent < len(prompts):
                    add()
    writer.close()
    return got


async def load(arm: str, port: int, concurrency: int, requests: int, tokens: int) -> tuple[int, float]:
    prompts = [[1, 10 + i % 50, 20 + i % 37, 30 + i % 11] for i in range(requests)]
    queue = list(range(requests))
    if arm == "front":
        start = time.perf_counter()
        total = await front_load(port, prompts, concurrency, tokens)
        return total, time.perf_counter() - start
    if arm == "grpc":
        import grpc
        from smg_grpc_proto.generated import vllm_engine_pb2 as pb
        from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.VllmEngineStub(channel)

        async def one(i: int) -> int:
            return await grpc_stream(stub, pb, prompts[i], tokens, i)
    else:
        async def one(i: int) -> int:
            path, body = http_body(arm, prompts[i], tokens)
            return await http_stream("127.0.0.1", port, path, body)

    async def worker() -> int:
        got = 0
        while queue:
            got += await one(queue.pop())
        return got

    start = time.perf_counter()
    total = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
    wall = time.perf_counter() - start
    if arm == "grpc":
        await channel.close()
    return total, wall


def ready(arm: str, port: int, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            asyncio.run(load(arm, port, 1, 1, 2))
            return
        except Exception:  # not serving yet
            time.sleep(1.0)
    raise TimeoutError(f"{arm}: vLLM did not serve within {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--arms", nargs="+", default=["completions", "tokens", "grpc", "front"],
                        choices=["completions", "tokens", "grpc", "front"])
    parser.add_argument("--start-timeout", type=float, default=600, help="seconds vLLM may take to serve")
    args = parser.parse_args()
    vllm_python = os.environ.get("FSCHED_VLLM_PYTHON")
    if vllm_python and Path(sys.prefix).resolve() != Path(vllm_python).parent.parent.resolve():
        os.execv(vllm_python, [vllm_python, *sys.argv])  # the clients need vLLM's environment
    overlay = os.environ.get("GRPC_OVERLAY")
    if overlay:
        sys.path.insert(0, overlay)
    model = str(Path.home() / ".cache" / "fsched" / "tiny-model-v1")
    log = Path(tempfile.gettempdir()) / f"engine_front_ends-{os.getpid()}.log"
    print(f"vLLM's log: {log}", file=sys.stderr, flush=True)
    rows = []
    for arm in args.arms:
        entry = (["-m", "vllm.entrypoints.launchers.grpc_server"] if arm == "grpc"
                 else [str(REPO / "core" / "runners" / "vllm_front.py")] if arm == "front"
                 else ["-m", "vllm.entrypoints.openai.api_server"])
        extra = ("--tokens-only",) if arm == "tokens" else ()
        env = {"PYTHONPATH": overlay} if arm == "grpc" and overlay else {}
        server = Server(entry, model, args.concurrency, extra, log, env)
        try:
            ready(arm, server.port, args.start_timeout)
            asyncio.run(load(arm, server.port, 4, 8, 8))  # warm-up
            front, whole = cpu_s(server.proc.pid), session_cpu_s(server.proc.pid)
            total, wall = asyncio.run(load(arm, server.port, args.concurrency, args.requests, args.tokens))
            n = max(1, total)
            row = {"arm": arm, "tokens": total, "wall_s": round(wall, 2), "tok_s": round(total / wall, 1),
                   "front_end_us_per_token": round(1e6 * (cpu_s(server.proc.pid) - front) / n, 1),
                   "vllm_us_per_token": round(1e6 * (session_cpu_s(server.proc.pid) - whole) / n, 1)}
        finally:
            server.stop()
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("| arm | tok/s | front end µs/token | vLLM (all processes) µs/token |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['tok_s']:,.0f} | {r['front_end_us_per_token']} | "
              f"{r['vllm_us_per_token']} |")


if __name__ == "__main__":
    main()
