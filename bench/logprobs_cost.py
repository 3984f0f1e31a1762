"""What logprobs cost an online request, end to end: `fsched serve` and a stand-in daemon on SQLite.

    .venv/bin/python bench/logprobs_cost.py [--n 8] [--tokens 150] [--top 20] [--repeat 3] [--fsched PATH]

Starts a daemon (`standin:1ms`: the engine costs nearly nothing, so what is
measured is fsched's own work) and a server on a new SQLite file, then times
one chat request of `n` choices and `tokens` tokens each (ignore_eos), with
`top_logprobs` alternatives and without logprobs, `repeat` times each. Prints
the median seconds of each and their ratio. --fsched runs another build's
`fsched` (to compare).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(url: str, auth: dict, body: dict) -> float:
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=600)
    r.raise_for_status()
    took = time.perf_counter() - start
    usage = r.json()["usage"]["completion_tokens"]
    assert usage == body["n"] * body["max_tokens"], usage
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fsched", default=str(Path(sys.executable).parent / "fsched"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fsched-logprobs-"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")},
           "FSCHED_DB": f"sqlite:///{work / 'fsched.db'}"}
    key = subprocess.run([args.fsched, "keys", "create", "bench", "--class", "realtime"], env=env,
                         capture_output=True, check=True).stdout.decode().strip()
    port = free_port()
    procs = [subprocess.Popen([args.fsched, "daemon", "--model", "standin:1ms", "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([args.fsched, "serve", "--port", str(port), "--no-access-log"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).json().get("daemons_alive"):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": args.n,
                "max_tokens": args.tokens, "ignore_eos": True, "temperature": 1.0, "seed": 1}
        plain = [timed(url, auth, body) for _ in range(args.repeat)]
        asked = [timed(url, auth, {**body, "logprobs": True, "top_logprobs": args.top})
                 for _ in range(args.repeat)]
        p, a = statistics.median(plain), statistics.median(asked)
        print(f"n={args.n} x {args.tokens} tokens: without logprobs {p:.2f} s, with top_logprobs "
              f"{args.top} {a:.2f} s ({a / p:.1f}x)  [medians of {args.repeat}]")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
