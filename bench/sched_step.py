"""What the scheduler's step costs the daemon: `schedule` and `postprocess` with N streams running.

    .venv/bin/python bench/sched_step.py [--steps 2000]

The fsched policy over N requests (realtime, streaming and batch in turn, 64
tokens each, one tenant or four), refilled as they finish; at each step a
fraction of the producing rows yields a token (a remote engine's tokens do not
all arrive within one step). Per case: process CPU µs per step and per token,
and a digest of every plan and charge: two versions of the scheduler that make
the same decisions print the same digests.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Outcome
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass

CASES = [(32, 1.0, 1), (32, 0.25, 1), (128, 1.0, 1), (128, 0.25, 1), (128, 0.25, 4)]
CLASSES = [RequestClass.STREAMING, RequestClass.REALTIME, RequestClass.BATCH]


def run(n: int, fraction: float, steps: int, tenants: int, digest: bool) -> tuple[float, int, str]:
    """(CPU seconds, tokens, digest) of `steps` steps with `n` requests running."""
    rng = random.Random(1)
    scheduler = Scheduler(SchedulerConfig(max_batch=max(64, n)), "fsched")
    added = 0

    def add(now: float) -> None:
        nonlocal added
        added += 1
        scheduler.add(Request(f"r{added}", f"t{added % tenants}", CLASSES[added % 3], 20 + added % 7, 64,
                              now))

    for _ in range(n):
        add(0.0)
    h, now, tokens = hashlib.sha256(), 0.0, 0
    start = time.process_time()
    for _ in range(steps):
        now += 0.002
        plan = scheduler.schedule(now)
        produced = {rid: 1 for rid in plan.producing() if rng.random() < fraction}
        tokens += len(produced)
        post = scheduler.postprocess(plan, Outcome(elapsed_s=0.002, produced=produced), now)
        if digest:
            h.update(repr((plan, sorted(post.charges.items()), post.finished)).encode())
        for _ in post.finished:
            add(now)
    return time.process_time() - start, tokens, h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    for n, fraction, tenants in CASES:
        _, _, digest = run(n, fraction, args.steps, tenants, digest=True)
        cpu, tokens, _ = run(n, fraction, args.steps, tenants, digest=False)  # timed without the digest
        print(f"{n:4d} running, {fraction:.2f} of rows a step, {tenants} tenant(s): "
              f"{1e6 * cpu / args.steps:7.1f} µs/step {1e6 * cpu / max(1, tokens):6.2f} µs/token  "
              f"digest {digest}")


if __name__ == "__main__":
    main()
