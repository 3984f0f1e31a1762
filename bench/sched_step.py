"""What the scheduler's step costs the daemon: `schedule` and `postprocess` with N streams running.

    .venv/bin/python bench/sched_step.py [--steps 2000] [--passes 5]

The fsched policy over N requests (realtime, streaming and batch in turn, 64
tokens each, one tenant or four), refilled as they finish; at each step a
fraction of the producing rows yields a token (a remote engine's tokens do not
all arrive within one step). Per case: process CPU µs per step and per token,
and a digest of every plan and charge: two versions of the scheduler that make
the same decisions print the same digests.

A burst case: a full batch (mostly batch work of four tenants, some realtime
and streaming) of R running rows past their prefill, then W realtime waiters
arrive at once; the one scheduler pass that admits them (choosing each one's
victims) is timed, over `--passes` such states, with a digest of its plans.

An online burst: W realtime requests of one tenant or four arrive at once at
an empty batch with room for all; the pass that admits them is timed (the
best of at least 20), per admission, with a digest of its plans.
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
BURSTS = [(256, 32)]  # (running rows, realtime waiters)
ADMISSIONS = [(128, 1), (128, 4)]  # (realtime waiters admitted at once into an empty batch, tenants)


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


def full_batch(rows: int, seed: int) -> tuple[Scheduler, float]:
    """A scheduler whose `rows` slots all hold decoding requests, and the time it got there."""
    rng = random.Random(seed)
    scheduler = Scheduler(SchedulerConfig(max_batch=rows, kv_tokens=rows * 480), "fsched")
    for i in range(rows):
        cls = rng.choices(CLASSES, weights=(1, 1, 8))[0]
        scheduler.add(Request(f"b{i}", f"t{rng.randrange(4)}", cls, rng.randint(40, 300), 400,
                              rng.random() * 0.01, priority=rng.randint(3, 7)))
    now = 0.01
    for _ in range(200):
        now += 0.05
        plan = scheduler.schedule(now)
        scheduler.postprocess(plan, Outcome(elapsed_s=0.05, produced={rid: 1 for rid in plan.producing()}),
                              now)
        if len(scheduler.running) == rows and not plan.prefill and rng.random() < 0.2:
            break
    return scheduler, now


def burst(rows: int, waiters: int, passes: int) -> tuple[float, str]:
    """(CPU seconds a pass, digest) of the pass admitting `waiters` realtime requests into a full batch."""
    h, cpu = hashlib.sha256(), 0.0
    for seed in range(passes):
        scheduler, now = full_batch(rows, seed)
        rng = random.Random(1000 + seed)
        for i in range(waiters):
            scheduler.add(Request(f"w{i}", f"t{rng.randrange(4)}", RequestClass.REALTIME,
                                  rng.randint(20, 200), 32, now, priority=rng.randint(3, 7)))
        start = time.process_time()
        plan = scheduler.schedule(now)
        cpu += time.process_time() - start
        h.update(repr(plan).encode())
    return cpu / passes, h.hexdigest()[:16]


def admissions(waiters: int, tenants: int, passes: int) -> tuple[float, str]:
    """(CPU seconds an admission, digest) of the pass admitting `waiters` realtime requests of `tenants`
    tenants at once into an empty batch with room for all (an online burst), the best of `passes`."""
    h, best = hashlib.sha256(), float("inf")
    for seed in range(passes):
        scheduler = Scheduler(SchedulerConfig(max_batch=waiters, kv_tokens=waiters * 300), "fsched")
        rng = random.Random(2000 + seed)
        for i in range(waiters):
            scheduler.add(Request(f"w{i}", f"t{i % tenants}", RequestClass.REALTIME, rng.randint(20, 200), 32,
                                  0.0))
        start = time.process_time()
        plan = scheduler.schedule(0.001)
        best = min(best, time.process_time() - start)
        h.update(repr(plan).encode())
    return best / waiters, h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=5, help="states timed per burst case")
    args = parser.parse_args()
    for n, fraction, tenants in CASES:
        _, _, digest = run(n, fraction, args.steps, tenants, digest=True)
        cpu, tokens, _ = run(n, fraction, args.steps, tenants, digest=False)  # timed without the digest
        print(f"{n:4d} running, {fraction:.2f} of rows a step, {tenants} tenant(s): "
              f"{1e6 * cpu / args.steps:7.1f} µs/step {1e6 * cpu / max(1, tokens):6.2f} µs/token  "
              f"digest {digest}")
    for rows, waiters in BURSTS:
        cpu, digest = burst(rows, waiters, args.passes)
        print(f"{rows:4d} running, {waiters} realtime waiters arrive: {1e6 * cpu:9.1f} µs/pass  "
              f"digest {digest}")
    for waiters, tenants in ADMISSIONS:
        cpu, digest = admissions(waiters, tenants, max(args.passes, 20))
        print(f"   0 running, {waiters} realtime waiters of {tenants} tenant(s) admitted at once: "
              f"{1e6 * cpu:6.1f} µs/admission  digest {digest}")


if __name__ == "__main__":
    main()
