"""What concurrent batch creations from one large upload cost `fsched serve`'s memory.

    .venv/bin/python bench/batch_create.py [--mb 55] [--words 400] [--creations 4] [--fsched PATH]

Starts `fsched serve` on a new SQLite file (no daemon: the batches only need
storing), uploads one JSONL file of about `mb` MB of completions lines (a prompt of `words` words
each: at 1,000 words a 200 MiB file stays under the 50,000-line limit),
then asks for `creations` batches from it at once, one tenant. Prints serve's
peak RSS (VmHWM) before and after, and each creation's status.
--fsched runs another build's `fsched` (to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from uploads import free_port, make_key, peak_rss_mb, upload_all  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=55)
    parser.add_argument("--words", type=int, default=400)
    parser.add_argument("--creations", type=int, default=4)
    parser.add_argument("--fsched", default=str(Path(sys.executable).parent / "fsched"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fsched-batches-"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")},
           "FSCHED_DB": f"sqlite:///{work / 'fsched.db'}"}
    payload = work / "input.jsonl"
    with payload.open("w") as out:
        i = 0
        while out.tell() < args.mb * 1_000_000:
            out.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                  "body": {"model": "m", "prompt": f"line {i} " + "word " * args.words,
                                           "max_tokens": 4}}) + "\n")
            i += 1
    key = make_key(args.fsched, env)
    port = free_port()
    serve = subprocess.Popen([args.fsched, "serve", "--port", str(port), "--no-access-log"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
    try:
        for _ in range(100):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        (file_id,) = upload_all(url, auth, payload, 1)
        print(f"{i:,} lines, {payload.stat().st_size / 1e6:.0f} MB uploaded: serve peak RSS "
              f"{peak_rss_mb(serve.pid):,.0f} MB")
        body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}

        def create(_: int) -> str:
            r = httpx.post(f"{url}/v1/batches", json=body, headers=auth, timeout=900)
            return f"{r.status_code} {r.json().get('status') or r.json()['error']['code']}"

        started = time.perf_counter()
        with ThreadPoolExecutor(args.creations) as pool:
            answers = list(pool.map(create, range(args.creations)))
        print(f"{args.creations} creations at once ({time.perf_counter() - started:.1f} s): {answers}; "
              f"serve peak RSS {peak_rss_mb(serve.pid):,.0f} MB")
    finally:
        serve.terminate()
        serve.wait(10)


if __name__ == "__main__":
    main()
