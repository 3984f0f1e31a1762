"""What one push over the daemon's link costs each end, against a plain JSON object line as a baseline.

    .venv/bin/python bench/link_wire.py [--pushes 200000] [--rounds 3]

A push is one request's text after one step: the daemon makes the message
and encodes it (`core/ports/link.py`), a server decodes the line and makes the
request's progress of it (what `api/link.py` does). The baseline does the
same work with a JSON object of one-letter keys built as a dict and read back
with `json.loads` (the link's lines before its messages were typed). Process
CPU time, the best of `--rounds`, so other processes' load counts little.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsched.core.ports.link import Steps, StepText, decode, encode  # noqa: E402
from fsched.core.ports.records import RequestProgress  # noqa: E402
from fsched.core.types import RequestStatus  # noqa: E402


def typed_daemon(i: int) -> bytes:
    return encode([Steps([StepText(7, "12345", i % 50, " word", i)])])


def typed_server(line: bytes, texts: dict[int, str]) -> RequestProgress:
    message = decode(line).texts[0]
    progress = message.progress(texts.get(message.job, ""))
    texts[message.job] = progress.output_text
    return progress


def plain_daemon(i: int) -> bytes:
    m = {"job": 7, "req": "12345", "o": i % 50, "t": " word", "n": i, "ft": 1.5, "q": 1.25}
    return (json.dumps(m, separators=(",", ":")) + "\n").encode()


def plain_server(line: bytes, texts: dict[int, str]) -> RequestProgress:
    m = json.loads(line)
    text = texts.get(m["job"], "")[: m["o"]] + m["t"]
    progress = RequestProgress(m["req"], m["job"], RequestStatus.RUNNING, text, m["n"], m["q"], m.get("ft"),
                               None, None)
    texts[m["job"]] = progress.output_text
    return progress


def cost_us(daemon, server, pushes: int) -> tuple[float, float]:
    start = time.process_time()
    lines = [daemon(i) for i in range(pushes)]
    middle = time.process_time()
    texts: dict[int, str] = {}
    for line in lines:
        server(line, texts)
    end = time.process_time()
    return 1e6 * (middle - start) / pushes, 1e6 * (end - middle) / pushes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    best = {}
    arms = (("typed", typed_daemon, typed_server), ("plain", plain_daemon, plain_server))
    for name, daemon, server in arms:
        runs = [cost_us(daemon, server, args.pushes) for _ in range(args.rounds)]
        best[name] = (min(r[0] for r in runs), min(r[1] for r in runs))
    (td, ts), (pd, ps) = best["typed"], best["plain"]
    print(f"CPU per push, best of {args.rounds} x {args.pushes:,}:")
    print(f"  daemon (make + encode):   typed {td:.2f} us, plain {pd:.2f} us ({td / pd:.2f}x)")
    print(f"  server (decode + record): typed {ts:.2f} us, plain {ps:.2f} us ({ts / ps:.2f}x)")


if __name__ == "__main__":
    main()
