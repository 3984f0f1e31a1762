"""Usage accounting and shares: decay, the dominant-share definition, lift, reservations,
precedence use, VTC counters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsched.core.sched.shares import dominant_use, entitled_shares, served_shares, weighted_score
from fsched.core.sched.usage import (
    DrfMeter,
    PrecedenceUsage,
    TenantCharge,
    VtcMeter,
    decay_factor,
    lift_factor,
    precedence_window,
)


def drf(**kw):
    args = dict(default_weight=1.0, kv_capacity=1_000, half_life_s=10.0)
    args.update(kw)
    return DrfMeter({"a": 3.0, "b": 1.0}, **args)


def test_decay_halves_per_half_life():
    assert decay_factor(0, 10) == 1.0
    assert decay_factor(10, 10) == pytest.approx(0.5)
    assert decay_factor(30, 10) == pytest.approx(0.125)
    assert decay_factor(-5, 10) == 1.0


def test_weighted_score_is_dominant_use_over_weight():
    assert weighted_score(2.0, 500.0, 1_000.0, 1.0) == 2.0
    assert weighted_score(0.1, 500.0, 1_000.0, 1.0) == 0.5
    assert weighted_score(0.1, 500.0, 1_000.0, 2.0) == 0.25


def test_dominant_use_is_the_larger_fraction_of_capacity_over_the_window():
    assert dominant_use(5.0, 0.0, 1_000.0, window_s=10.0) == 0.5  # half the GPU
    assert dominant_use(1.0, 8_000.0, 1_000.0, window_s=10.0) == 0.8  # 80% of the KV cache
    with pytest.raises(ValueError):
        dominant_use(1.0, 1.0, 0.0)


def test_served_shares_sum_to_one_and_read_against_entitlement():
    shares = served_shares({"a": (3.0, 0.0), "b": (1.0, 2_000.0)}, 1_000.0)
    assert shares == {"a": pytest.approx(0.6), "b": pytest.approx(0.4)}  # b's KV use dominates
    assert served_shares({"a": (0.0, 0.0)}, 1_000.0) == {}
    # The window divides out: the same use over a longer window gives the same shares.
    assert served_shares({"a": (6.0, 0.0), "b": (2.0, 4_000.0)}, 1_000.0) == shares


def test_entitled_shares_among_tenants_with_work():
    e = entitled_shares({"a": 3.0, "b": 1.0, "c": 4.0}, ["a", "b"])
    assert e["a"] == 0.75 and e["b"] == 0.25 and e["c"] == pytest.approx(0.5)  # c would get half


def test_precedence_usage_is_a_fraction_of_the_machine():
    p = PrecedenceUsage(kv_capacity=1_000, half_life_s=10.0)
    assert p.fraction("a", 0.0) == 0.0
    p.charge({"a": TenantCharge(gpu_s=0.25), "b": TenantCharge(gpu_s=0.5)}, 1.0, 1.0)
    assert p.fraction("a", 1.0) == pytest.approx(0.25) and p.fraction("b", 1.0) == pytest.approx(0.5)
    p.charge({}, 1.0, 11.0)  # a second of nothing, 10 s later: both decayed alike
    assert p.fraction("a", 11.0) == pytest.approx(0.125 / 1.5)


def test_precedence_use_is_read_against_at_least_the_warm_up_window():
    """In a run's first seconds one prompt would be most of the window: until the decayed
    engine time reaches the warm-up it counts as the warm-up; after that it counts as itself."""
    p = PrecedenceUsage(kv_capacity=1_000, half_life_s=600.0, warmup_s=60.0)
    p.charge({"b": TenantCharge(gpu_s=4.0)}, 8.0, 8.0)  # 4 s of b's prompt in the first 8 s
    assert p.fraction("b", 8.0) == pytest.approx(4.0 / 60.0)
    p.charge({"b": TenantCharge(gpu_s=60.0)}, 112.0, 120.0)  # the window now past the warm-up
    assert p.fraction("b", 120.0) == pytest.approx(64.0 / 120.0, rel=0.1)
    assert precedence_window(8.0, 60.0) == 60.0 and precedence_window(120.0, 60.0) == 120.0


@given(score=st.floats(0, 100), floor=st.floats(0, 100))
def test_lift_factor_raises_to_floor_only(score, floor):
    f = lift_factor(score, floor)
    if score >= floor or floor <= 0:
        assert f == 1.0
    elif f != float("inf"):  # inf: no usage worth scaling, the meter sets it outright
        assert score * f == pytest.approx(floor)


def test_drf_meter_decays_and_weights():
    m = drf()
    m.charge({"a": TenantCharge(gpu_s=3.0), "b": TenantCharge(kv_token_s=2_000.0)}, 1.0, 0.0)
    assert m.scores(["a", "b"], 0.0) == {"a": pytest.approx(1.0), "b": pytest.approx(2.0)}
    assert m.score("b", 10.0) == pytest.approx(1.0)  # one half-life later


def test_drf_lift_raises_a_returning_tenant_to_the_lowest_backlogged_share():
    m = drf()
    m.charge({"a": TenantCharge(gpu_s=30.0), "b": TenantCharge(gpu_s=1.0)}, 1.0, 0.0)
    m.activate("b", ["a"], 0.0)
    assert m.score("b", 0.0) == pytest.approx(m.score("a", 0.0))
    m2 = drf(lift=False)
    m2.charge({"a": TenantCharge(gpu_s=30.0), "b": TenantCharge(gpu_s=1.0)}, 1.0, 0.0)
    m2.activate("b", ["a"], 0.0)
    assert m2.score("b", 0.0) == pytest.approx(1.0)
    m3 = drf()
    m3.charge({"a": TenantCharge(gpu_s=30.0)}, 1.0, 0.0)
    m3.activate("new", ["a"], 0.0)  # never used anything
    assert m3.score("new", 0.0) == pytest.approx(m3.score("a", 0.0))
    m3.activate("b", [], 0.0)  # nobody else waiting: nothing to lift to
    assert m3.score("b", 0.0) == 0.0


def test_lift_never_lowers_a_share():
    m = drf()
    m.charge({"a": TenantCharge(gpu_s=3.0), "b": TenantCharge(gpu_s=5.0)}, 1.0, 0.0)
    m.activate("b", ["a"], 0.0)
    assert m.score("b", 0.0) == pytest.approx(5.0)


def test_reservation_counts_until_released():
    m = drf()
    gpu, kv = m.reserve("b", context=100, prefill=100, decode=10)
    assert gpu > 0 and kv > 0 and m.score("b", 0.0) > 0
    m.release("b", gpu, kv)
    assert m.score("b", 0.0) == 0.0


def test_weights_must_be_positive():
    m = drf()
    with pytest.raises(ValueError):
        m.set_weight("a", 0.0)
    m.set_weight("a", 6.0)
    assert m.weight("a") == 6.0 and m.weight("unknown") == 1.0


def test_vtc_counts_weighted_input_and_output_tokens_and_lifts():
    m = VtcMeter({"a": 2.0}, default_weight=1.0)
    m.charge({"a": TenantCharge(prefill_tokens=100, decode_tokens=50)}, 1.0, 0.0)
    assert m.scores(["a"], 0.0)["a"] == pytest.approx((100 + 2 * 50) / 2)
    m.activate("b", ["a"], 0.0)
    assert m.scores(["b"], 0.0)["b"] == pytest.approx(100.0)


def test_drf_weight_change_keeps_the_score_continuous():
    from fsched.core.sched.usage import DrfMeter, TenantCharge

    meter = DrfMeter({"a": 1.0, "b": 1.0}, default_weight=1.0, kv_capacity=1000, half_life_s=600)
    meter.charge({"a": TenantCharge(gpu_s=3.0, kv_token_s=10.0), "b": TenantCharge(gpu_s=1.0)}, 4.0, 1.0)
    before = meter.scores(["a", "b"], 1.0)
    meter.set_weight("a", 3.0)
    after = meter.scores(["a", "b"], 1.0)
    assert after["a"] == pytest.approx(before["a"]) and after["b"] == pytest.approx(before["b"])
    # ... and from now on a's charges weigh a third: 3:1 service keeps the scores level.
    meter.charge({"a": TenantCharge(gpu_s=3.0), "b": TenantCharge(gpu_s=1.0)}, 4.0, 1.0)
    later = meter.scores(["a", "b"], 1.0)
    assert later["a"] - after["a"] == pytest.approx(later["b"] - after["b"])


# -- a cluster: daemons share usage through the job table ------------------------------


def test_peer_totals_sum_and_decay_by_age():
    from fsched.core.sched.usage import peer_totals

    rows = [("a", 4.0, 100.0, 0.0), ("a", 2.0, 0.0, 10.0), ("b", 1.0, 10.0, 20.0)]
    totals = peer_totals(rows, half_life_s=10.0)
    assert totals["a"] == pytest.approx((5.0, 100.0))
    assert totals["b"] == pytest.approx((0.25, 2.5))


def test_peer_usage_counts_in_scores_and_lift_moves_only_local_usage():
    m = drf()
    m.charge({"a": TenantCharge(gpu_s=3.0)}, 1.0, now=0.0)
    m.set_peer_usage({"a": (3.0, 0.0), "b": (2.0, 0.0)}, now=0.0)
    assert m.score("a", 0.0) == pytest.approx(6.0 / 3)  # own 3 + peers' 3, weight 3
    assert m.score("b", 0.0) == pytest.approx(2.0)
    assert m.local_usage(0.0) == {"a": (3.0, 0.0)}  # what it publishes: its own only
    m.set_peer_usage({"b": (1.0, 0.0)}, now=10.0)  # a new exchange replaces the last
    assert m.score("b", 10.0) == pytest.approx(1.0)
    # "c" returns to a backlog: lifted to the lowest active share, counting peers' usage of it.
    m.set_peer_usage({"c": (0.1, 0.0)}, now=10.0)
    assert m.score("c", 10.0) < m.score("a", 10.0)
    m.activate("c", ["a", "c"], now=10.0)
    assert m.score("c", 10.0) == pytest.approx(m.score("a", 10.0))
    assert m.local_usage(10.0)["c"][0] == pytest.approx(m.score("a", 10.0) - 0.1)  # weight of c: 1


def _serve(meters: list[DrfMeter], backlog: list[set[str]], steps: int, share_usage: bool) -> float:
    """Each step every daemon gives 1 GPU-second to its lowest-score backlogged tenant; returns
    the cluster's share of tenant "a" (weight 3 of 4)."""
    served = {"a": 0.0, "b": 0.0}
    for step in range(steps):
        now = float(step)
        if share_usage:
            published = [m.local_usage(now) for m in meters]
            for i, m in enumerate(meters):
                peers = {}
                for j, usage in enumerate(published):
                    for tenant, (gpu, kv) in usage.items():
                        if j != i:
                            g, k = peers.get(tenant, (0.0, 0.0))
                            peers[tenant] = (g + gpu, k + kv)
                m.set_peer_usage(peers, now)
        for m, tenants in zip(meters, backlog, strict=True):
            scores = m.scores(tenants, now)
            tenant = min(sorted(tenants), key=scores.__getitem__)
            m.charge({tenant: TenantCharge(gpu_s=1.0)}, 1.0, now + 1)
            served[tenant] += 1
    return served["a"] / sum(served.values())


def test_weights_hold_across_daemons_only_when_they_share_usage():
    # Daemon 0 holds only tenant a's work; daemon 1 holds both. Alone, daemon 1
    # splits 3:1 and the cluster gives a 87.5%. Sharing usage, daemon 1 makes
    # up for daemon 0 and the cluster splits 3:1.
    backlog = [{"a"}, {"a", "b"}]
    alone = _serve([drf(half_life_s=50.0), drf(half_life_s=50.0)], backlog, 400, share_usage=False)
    shared = _serve([drf(half_life_s=50.0), drf(half_life_s=50.0)], backlog, 400, share_usage=True)
    assert alone == pytest.approx(0.875, abs=0.02)
    assert shared == pytest.approx(0.75, abs=0.02)
