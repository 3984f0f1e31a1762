"""The small parts every online request and every streamed token pass through, timed in several source
trees in one run: what a cut of one of them saves, without a whole path's noise.

    .venv/bin/python bench/request_parsers.py [TREE ...] [--rounds 7] [--calls 3000]

A tree is a folder of fsched's sources (`git archive REV | tar -x -C DIR`, or a worktree; default:
this one), imported as package `fsched` in a process of its own with this environment's packages.
Each round runs every tree in turn, and each tree times, in process CPU time, `--calls` calls of:
- `encode`: the daemon's encoding of a chat request's messages for the tiny model, chat template
  included (`encode_prompt`), and, as the baseline in the same process, transformers' own
  `apply_chat_template(..., tokenize=True)` of the same messages (the ids must be the same);
- `parse`: serve's reading of a streamed chat body (`parse_online`, as bench/light_client.py sends it);
- `chunk`: the daemon's reading of one streamed token from vLLM's token interface (one HTTP chunk of
  one `data:` event, as vLLM 0.32 writes it, through `streams.received`).
Printed: each part's µs a call per tree, the best (and the median) of `--rounds`, and each tree's ratio
to the first tree's best. The best, as `timeit` takes it: on a shared machine a round's figure moves by
half with the machine's speed (medians of seven rounds of one tree went 3.5 and 5.1 µs a chunk in
one run), and what slows a round is never the code under test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from online_ab import package_of  # noqa: E402

PROBE = r'''
import json, sys, time
calls = int(sys.argv[1])
from fsched.core.runners.hf.tokenizer import load_tokenizer
from fsched.core.runners.hf.model import encode_prompt
from fsched.core.openai.online import parse_online
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.limits import InputLimits
from fsched.core.types import Endpoint, RequestClass
from fsched.core.runners.streams import BODY, Stream, received

def timed(f):
    f()
    start = time.process_time()
    for _ in range(calls):
        f()
    return (time.process_time() - start) / calls * 1e6

tok = load_tokenizer("tiny")
messages = [{"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "tell me about fair scheduling, request 17"}]
ours = encode_prompt(tok, None, messages)
theirs = tok.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
assert ours == theirs, "encode_prompt differs from apply_chat_template"
key = ApiKey("k", "bench", RequestClass.REALTIME, "k", "h", 0.0)
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "tell me about fair scheduling"}],
                   "max_tokens": 64, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}, "ignore_eos": True})
limits = InputLimits()
event = (b'data: {"request_id":"3f0e2c1a9b8d4e7f","choices":[{"index":0,"logprobs":null,"finish_reason":null,'
         b'"stop_reason":null,"token_ids":[1234]}]}\n\n')
read = b"%x\r\n" % len(event) + event + b"\r\n"
stream = Stream(None, b"", state=BODY, status=200, chunked=True)

def chunk():
    received(stream, read)
    stream.tokens = []

print(json.dumps({
    "encode": timed(lambda: encode_prompt(tok, None, messages)),
    "encode_transformers": timed(lambda: tok.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True)),
    "parse": timed(lambda: parse_online(body, Endpoint.CHAT, key, limits)),
    "chunk": timed(chunk),
}))
'''


def run_tree(tree: Path, package: Path, calls: int) -> dict[str, float]:
    """The probe's figures for the sources in `package` (a folder holding them as package `fsched`)."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(calls)], capture_output=True, text=True,
                         env={"PYTHONPATH": str(package), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
                         cwd=package)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, default=[REPO])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    got: dict[Path, list[dict]] = {tree: [] for tree in args.trees}
    with tempfile.TemporaryDirectory() as tmp:
        packages = [package_of(tree, Path(tmp) / str(i)) for i, tree in enumerate(args.trees)]
        for _ in range(args.rounds):
            for tree, package in zip(args.trees, packages, strict=True):
                got[tree].append(run_tree(tree, package, args.calls))
    parts = list(got[args.trees[0]][0])
    print(f"| part | {' | '.join(str(t) for t in args.trees)} |")
    print(f"|---|{'---|' * len(args.trees)}")
    for part in parts:
        base = min(r[part] for r in got[args.trees[0]])
        cells = []
        for tree in args.trees:
            values = [r[part] for r in got[tree]]
            cells.append(f"{min(values):.1f} µs (median {statistics.median(values):.1f}), "
                         f"{min(values) / base:.2f}x")
        print(f"| {part} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
