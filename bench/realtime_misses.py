"""Why fsched misses the realtime requests it misses: one matrix cell, request by request.

    .venv/bin/python bench/realtime_misses.py [--trace mooncake] [--load 1.2] [--heavy]
        [--seeds 7,11,13] [--limit 4000]

For each cell (the same requests as `bench/policy_matrix.py`), counts the realtime requests on
target under fsched and priority, and what is attainable at all (the prompt alone on an idle
engine within 0.5 s), and sorts each attainable request fsched misses into one cause:

* **phase**: the step in flight when it arrived, plus its prompt alone, is already over the
  target. Nothing decided after its arrival can save it; a policy whose steps happen to start
  just after the arrival can (the baselines' steps fall elsewhere).
* **resident**: it starts at the next step, and nothing but its own chunks is prefilled in its
  steps and nothing is copied in them, yet the KV held by the running batch and its decode rows
  (which every step pays for on the cost model) put it over.
* **other**: a wait for room or budget, a checkpoint copied in its steps, another prefill in its
  steps: what an order can act on.

`phase-feasible` counts the attainable requests whose phase allows the target (the ceiling given
fsched's own step boundaries); each miss shows its margin over the target.
"""

from __future__ import annotations

import argparse
import bisect
import sys

from policy_matrix import COST, MIX, MIX_HEAVY, WEIGHTS, Scenario, rate_scale, requests_of

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan
from fsched.core.sim.simulator import simulate
from fsched.core.types import RequestClass


def alone_s(prompt: int, config: SchedulerConfig) -> float:
    """The prompt's prefill alone on an idle engine, in chunks of `step_tokens`."""
    step = config.step_tokens
    return sum(COST.step_s(min(step, prompt - done), done) for done in range(0, prompt, step))


def steps_of(trace: list, policy: str) -> list[tuple[float, Plan]]:
    steps: list[tuple[float, Plan]] = []
    simulate(trace, policy, weights=WEIGHTS, cost=COST,
             observer=lambda now, plan, _: steps.append((now, plan)))
    return steps


def first_tokens(steps: list[tuple[float, Plan]]) -> dict[str, float]:
    """Each request's first token: the end of the step whose chunk completed its prefill."""
    out = {}
    for i, (_, plan) in enumerate(steps[:-1]):
        for c in plan.prefill:
            if c.produces_token and c.request_id not in out:
                out[c.request_id] = steps[i + 1][0]
    return out


def cell(s: Scenario, limit: int, scale: float, config: SchedulerConfig) -> None:
    trace = requests_of(s, limit, scale)
    target = config.realtime_target_s
    realtime = [str(i) for i, r in enumerate(trace) if r.request_class is RequestClass.REALTIME
                and r.prompt_tokens + r.output_tokens + config.min_quantum_steps <= config.kv_tokens]
    ours, prio = steps_of(trace, "fsched"), steps_of(trace, "priority")
    ours_first, prio_first = first_tokens(ours), first_tokens(prio)

    def on_target(first: dict[str, float], rid: str) -> bool:
        return first.get(rid, float("inf")) - trace[int(rid)].arrival_s <= target

    starts = [t for t, _ in ours]
    chunks: dict[str, list[int]] = {}
    for i, (_, plan) in enumerate(ours):
        for c in plan.prefill:
            chunks.setdefault(c.request_id, []).append(i)
    causes: dict[str, list[str]] = {"phase": [], "resident": [], "other": []}
    attainable = feasible = 0
    for rid in realtime:
        r = trace[int(rid)]
        alone = alone_s(r.prompt_tokens, config)
        if alone > target:
            continue
        attainable += 1
        k = bisect.bisect_left(starts, r.arrival_s)
        in_flight = starts[k] - r.arrival_s if k < len(starts) else 0.0
        feasible += in_flight + alone <= target
        if on_target(ours_first, rid):
            continue
        over = ours_first.get(rid, float("inf")) - r.arrival_s - target
        if in_flight + alone > target:
            causes["phase"].append(f"{rid} +{1000 * over:.0f} ms")
            continue
        own = chunks.get(rid, [])
        alone_in_steps = bool(own) and own[0] == k and all(
            ours[i][1].swap_tokens == 0 and ours[i][1].prefill[-1].request_id == rid
            and len(ours[i][1].prefill) == 1 for i in own)
        causes["resident" if alone_in_steps else "other"].append(f"{rid} +{1000 * over:.0f} ms")
    hits = sum(on_target(ours_first, rid) for rid in realtime)
    prio_hits = sum(on_target(prio_first, rid) for rid in realtime)
    print(f"{s.trace} {s.load:g}x {'10/20/70' if s.mix == MIX_HEAVY else '5/15/80'} seed {s.seed}, "
          f"{limit} requests: realtime {len(realtime)}, on target fsched {hits}, priority {prio_hits} "
          f"(1.05x: {1.05 * prio_hits:.1f}), attainable {attainable}, phase-feasible {feasible}")
    for cause, misses in causes.items():
        if misses:
            print(f"    {cause} ({len(misses)}): {', '.join(misses)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake", choices=("azure", "mooncake"))
    ap.add_argument("--load", type=float, default=1.2)
    ap.add_argument("--heavy", action="store_true", help="the 10/20/70 mix (default 5/15/80)")
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[7, 11, 13])
    ap.add_argument("--limit", type=int, default=4000)
    args = ap.parse_args(argv)
    config = SchedulerConfig()
    scale = rate_scale(args.trace, args.load, args.limit, config)
    for seed in args.seeds:
        cell(Scenario("cell", args.trace, args.load, seed, mix=MIX_HEAVY if args.heavy else MIX),
             args.limit, scale, config)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
