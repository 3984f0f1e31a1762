"""Where Jain's index in a matrix cell comes from: the spells in which both tenants had work waiting.

    .venv/bin/python bench/jain_windows.py [--trace mooncake] [--load 1.5] [--heavy]
        [--seeds 13] [--limit 2000] [--policies vtc,fsched]

The matrix judges Jain's index over the steps in which both tenants had work waiting
(`PolicyReport.backlogged_s`). On a trace whose load comes in bursts that time is not one window
but many short spells. For each policy this prints the spells of 10 s or more (tenant a's served
share in each), and splits the engine's tokens in all spells together (prefill tokens and decode
rows, a proxy for the dominant share the index uses) by when the request was admitted: before the
spell began (work the order chose while only one tenant waited, or none) or inside it (what the
order chooses while both compete), and by tenant and class. Tenant a's entitled share is 0.75.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from policy_matrix import COST, MIX, MIX_HEAVY, WEIGHTS, Scenario, rate_scale, requests_of

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.plan import Plan
from fsched.core.sched.scheduler import Scheduler
from fsched.core.sim.simulator import simulate

MIN_SPELL_S = 10.0


class Spells:
    """Follows one run through the simulator's observer (each plan before it runs)."""

    def __init__(self, labels: dict[str, tuple[str, str]]) -> None:
        self.labels = labels  # request id -> (tenant, class)
        self.admitted_at: dict[str, float] = {}
        self.start: float | None = None
        self.spells: list[list] = []  # [start, last step, {tenant: tokens}]
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)  # (tenant, "before" | "inside")
        self.by_class: dict[tuple[str, str], int] = defaultdict(int)

    def __call__(self, now: float, plan: Plan, sched: Scheduler) -> None:
        for rid in plan.admitted:
            self.admitted_at[rid] = now
        if len(sched.backlogged_tenants()) < 2:
            self.start = None
            return
        if self.start is None:
            self.start = now
            self.spells.append([now, now, defaultdict(int)])
        spell = self.spells[-1]
        spell[1] = now
        work = [(c.request_id, c.tokens) for c in plan.prefill] + [(rid, 1) for rid in plan.decode]
        for rid, n in work:
            tenant, request_class = self.labels[rid]
            when = "inside" if self.admitted_at.get(rid, -1.0) >= self.start else "before"
            self.tokens[tenant, when] += n
            self.by_class[tenant, request_class] += n
            spell[2][tenant] += n


def a_share(tokens: dict[str, int]) -> str:
    total = tokens.get("a", 0) + tokens.get("b", 0)
    return f"{tokens.get('a', 0) / total:.3f}" if total else "-"


def cell(s: Scenario, limit: int, scale: float, policies: list[str]) -> None:
    trace = requests_of(s, limit, scale)
    labels = {str(i): (r.tenant, r.request_class.value) for i, r in enumerate(trace)}
    mix = "10/20/70" if s.mix == MIX_HEAVY else "5/15/80"
    print(f"{s.trace} {s.load:g}x {mix} seed {s.seed}, {limit} requests")
    for policy in policies:
        spells = Spells(labels)
        report = simulate(trace, policy, weights=WEIGHTS, cost=COST, observer=spells)
        total = sum(spells.tokens.values()) or 1
        split = {when: {t: spells.tokens[t, when] for t in ("a", "b")} for when in ("before", "inside")}
        print(f"  {policy}: Jain {report.jain_index:.4f}, a's share {report.tenants['a'].share:.3f} over "
              f"{report.backlogged_s:.0f} s of both waiting in {len(spells.spells)} spells")
        for when, tokens in split.items():
            print(f"    admitted {when} the spell: {sum(tokens.values()) / total:.2f} of the tokens, "
                  f"a's part {a_share(tokens)}")
        print("    by tenant and class: " + ", ".join(
            f"{t} {c} {n / total:.3f}" for (t, c), n in sorted(spells.by_class.items())))
        long_spells = [sp for sp in spells.spells if sp[1] - sp[0] >= MIN_SPELL_S]
        print("    spells of 10 s or more (start-end s: a's part): " + ", ".join(
            f"{a:.0f}-{b:.0f}: {a_share(tok)}" for a, b, tok in long_spells))
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake", choices=("azure", "mooncake"))
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--heavy", action="store_true", help="the 10/20/70 mix (default 5/15/80)")
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[13])
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--policies", type=lambda v: v.split(","), default=["vtc", "fsched"])
    args = ap.parse_args(argv)
    config = SchedulerConfig()
    scale = rate_scale(args.trace, args.load, args.limit, config)
    for seed in args.seeds:
        cell(Scenario("cell", args.trace, args.load, seed, mix=MIX_HEAVY if args.heavy else MIX),
             args.limit, scale, args.policies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
