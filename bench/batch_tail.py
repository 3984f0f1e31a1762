"""Which batch requests decide the near-capacity batch p99, and what went ahead of them while they waited.

    .venv/bin/python bench/batch_tail.py [--trace mooncake] [--load 1.2] [--seeds 17,19]
        [--limit 2000] [--top 20] [--policies fsched,vtc]

For each cell (the same requests as `bench/policy_matrix.py`) and policy, prints the batch
first-token p99 and the `--top` slowest batch requests under the first policy, each with its
first token under every policy, and for the first policy: how long it waited for admission, how
often it was preempted before its first token, the share of its wait in which its tenant stood
within its share and had precedence (fsched's standings), and the requests admitted while it
waited, by tenant and class, and how many of those arrived after it (went ahead of it).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from policy_matrix import COST, MIX, WEIGHTS, Scenario, rate_scale, requests_of

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan
from fsched.core.sched.scheduler import Scheduler
from fsched.core.sim.metrics import percentile
from fsched.core.sim.simulator import simulate
from fsched.core.types import RequestClass


class Steps:
    """Every plan with its start time, and each tenant's standing at it (the observer)."""

    def __init__(self, standings: bool) -> None:
        self.standings = standings
        self.rows: list[tuple[float, Plan, dict]] = []
        self.heads: list[str | None] = []  # the best waiting request after the step's admissions

    def __call__(self, now: float, plan: Plan, sched: Scheduler) -> None:
        stand = sched.standings(now) if self.standings else {}
        waiting = list(sched.waiting()) if self.standings else []
        best = min(waiting, key=lambda r: sched.policy.rank(r, now, stand)) if waiting else None
        self.heads.append(best.id if best else None)
        self.rows.append((now, plan, {t: (s.in_share, s.precedence) for t, s in stand.items()}))

    def first_tokens(self) -> dict[str, float]:
        out = {}
        for i, (_, plan, _) in enumerate(self.rows[:-1]):
            for c in plan.prefill:
                if c.produces_token and c.request_id not in out:
                    out[c.request_id] = self.rows[i + 1][0]
        return out


def _described(r) -> str:
    return f"{r.tenant} {r.request_class.value} {r.prompt_tokens}"


def wait_of(rid: str, steps: Steps, trace: list, first: float) -> dict:
    """What happened between `rid`'s arrival and its first token."""
    me = trace[int(rid)]
    admitted_at, preempted, ahead, after, span = None, 0, Counter(), Counter(), Counter()
    notes: list[str] = []
    seen: set[str] = set()  # admitted once already: a resume is not counted again
    running, prefill = False, Counter()
    for i, (now, plan, stand) in enumerate(steps.rows):
        if now < me.arrival_s:
            seen.update(plan.admitted)
            continue
        if now >= first:
            break
        dt = (steps.rows[i + 1][0] if i + 1 < len(steps.rows) else now) - now
        if admitted_at is None:
            span["wait"] += dt
            in_share, precedence = stand.get(me.tenant, (True, True))
            span["in_share"] += dt * in_share
            span["precedence"] += dt * precedence
        if rid in plan.admitted:
            admitted_at, running = admitted_at if admitted_at is not None else now, True
        running = running and not any(p.request_id == rid for p in plan.preempted)
        if not running:  # whose prefill the engine ran while this request was out of the batch
            for c in plan.prefill:
                r = trace[int(c.request_id)]
                prefill[f"{r.tenant} {r.request_class.value[:2]}"] += c.tokens
        if steps.heads and admitted_at is None:
            span["head"] += dt * (steps.heads[i] == rid)
        for p in plan.preempted:
            if p.request_id == rid:
                preempted += 1
                by = [_described(trace[int(o)]) for o in plan.admitted]
                notes.append(f"preempted at +{now - me.arrival_s:.2f} s ({p.checkpoint.name}, "
                             f"{p.kv_tokens} KV) admitting {by}")
        if rid in plan.admitted and preempted and now > admitted_at:
            notes.append(f"back at +{now - me.arrival_s:.2f} s")
        for other in plan.admitted:
            if other != rid and other not in seen and (admitted_at is None or now == admitted_at):
                r = trace[int(other)]
                key = f"{r.tenant} {r.request_class.value}"
                ahead[key] += 1
                after[key] += r.arrival_s > me.arrival_s
            seen.add(other)
    return {"admitted": admitted_at, "preempted": preempted, "ahead": ahead, "after": after, "span": span,
            "notes": notes, "prefill": prefill}


def cell(s: Scenario, limit: int, scale: float, policies: list[str], top: int) -> None:
    trace = requests_of(s, limit, scale)
    batch = [str(i) for i, r in enumerate(trace) if r.request_class is RequestClass.BATCH]
    runs, firsts = {}, {}
    for p in policies:
        runs[p] = Steps(standings=p == "fsched")
        simulate(trace, p, weights=WEIGHTS, cost=COST, observer=runs[p])
        firsts[p] = runs[p].first_tokens()
    waits = {p: {rid: firsts[p][rid] - trace[int(rid)].arrival_s for rid in batch if rid in firsts[p]}
             for p in policies}
    print(f"{s.trace} {s.load:g}x seed {s.seed}, {limit} requests, {len(batch)} batch: p99 " + ", ".join(
        f"{p} {percentile(list(w.values()), 99):.2f} s" for p, w in waits.items()))
    for tenant in sorted(WEIGHTS):
        print(f"  tenant {tenant} batch p99: " + ", ".join(
            f"{p} {percentile([v for k, v in w.items() if trace[int(k)].tenant == tenant], 99):.2f} s"
            for p, w in waits.items()))
    lead = policies[0]
    p99 = percentile(list(waits[lead].values()), 99)
    above = [rid for rid, w in waits[lead].items() if w >= p99]
    summary = [wait_of(rid, runs[lead], trace, firsts[lead][rid]) for rid in above]
    prefill = sum((w["prefill"] for w in summary), Counter())
    total = sum(prefill.values()) or 1
    of_b = sum(trace[int(r)].tenant == "b" for r in above)
    shares = ", ".join(f"{k} {n / total:.2f}" for k, n in sorted(prefill.items()))
    print(f"  {lead}: {len(above)} batch requests at or above its p99, {of_b} of tenant b; "
          f"{sum(w['preempted'] > 0 for w in summary)} preempted before their first token; prefill "
          f"while they were out of the batch: {shares}")
    for rid in sorted(waits[lead], key=waits[lead].get, reverse=True)[:top]:
        r = trace[int(rid)]
        w = wait_of(rid, runs[lead], trace, firsts[lead][rid])
        span = w["span"]
        wait = span["wait"] or 1e-9
        others = ", ".join(f"{p} {waits[p][rid]:.2f}" for p in policies[1:])
        adm = "-" if w["admitted"] is None else f"{w['admitted'] - r.arrival_s:.2f}"
        print(f"  {rid} {r.tenant} {r.prompt_tokens} tok at {r.arrival_s:.0f} s: "
              f"{lead} {waits[lead][rid]:.2f} "
              f"({others}); admitted after {adm} s, preempted {w['preempted']}x, in share "
              f"{span['in_share'] / wait:.2f}, precedence {span['precedence'] / wait:.2f}, head "
              f"{span['head'] / wait:.2f} of the wait")
        total = sum(w["prefill"].values()) or 1
        print("      prefill while out of the batch: " + ", ".join(
            f"{k} {n / total:.2f}" for k, n in sorted(w["prefill"].items())) + f" of {total} tokens")
        if w["notes"]:
            print("      " + "; ".join(w["notes"]))
        print("      admitted while it waited (of them arrived after it): " + ", ".join(
            f"{k} {n} ({w['after'][k]})" for k, n in sorted(w["ahead"].items())))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake", choices=("azure", "mooncake"))
    ap.add_argument("--load", type=float, default=1.2)
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[17, 19])
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--policies", type=lambda v: v.split(","), default=["fsched", "vtc", "priority"])
    args = ap.parse_args(argv)
    scale = rate_scale(args.trace, args.load, args.limit, SchedulerConfig())
    for seed in args.seeds:
        cell(Scenario("near capacity", args.trace, args.load, seed, mix=MIX), args.limit, scale,
             args.policies, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
