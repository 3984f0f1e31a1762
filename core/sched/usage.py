"""Per-tenant usage accounting: weighted DRF (fsched) and VTC counters.

A meter turns what each step consumed into one score per tenant; within a
band the tenant with the lowest score goes first. The arithmetic lives in
pure functions; the meters only hold state.

Weighted DRF: two resources, compute (GPU seconds, each step's time
apportioned by the tokens each request processed) and KV memory
(token-slots held x seconds). Usage decays with a half-life. A tenant's
score is its dominant use over its weight (`shares.weighted_score`, where
the dominant use is defined once); both resources are measured over the
same decayed window, so the window length divides out of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.shares import dominant_use, weighted_score


@dataclass(slots=True)
class TenantCharge:
    """What one tenant consumed in one step (or a run of identical steps)."""

    gpu_s: float = 0.0
    kv_token_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0


def decay_factor(dt: float, half_life_s: float) -> float:
    """Weight left on usage `dt` seconds old."""
    return 0.5 ** (max(dt, 0.0) / half_life_s)


def lift_factor(score: float, floor: float) -> float:
    """Multiplier that raises `score` to `floor` (1.0 when already there)."""
    if score >= floor or floor <= 0:
        return 1.0
    return math.inf if score <= 0 else floor / score


class TenantMeter(Protocol):
    def weight(self, tenant: str) -> float: ...
    def set_weight(self, tenant: str, weight: float) -> None: ...
    def activate(self, tenant: str, active: Iterable[str], now: float) -> None: ...
    def charge(
        self, charges: Mapping[str, TenantCharge], elapsed_s: float, now: float, steps: int = 1
    ) -> None: ...
    def scores(self, tenants: Iterable[str], now: float) -> dict[str, float]: ...
    def provisional(self, score: float, tenant: str, tokens: int, now: float) -> float: ...
    def reserve(
        self, tenant: str, context: int, prefill: int, decode: int
    ) -> tuple[float, float]: ...
    def release(self, tenant: str, gpu_s: float, kv_token_s: float) -> None: ...
    def local_usage(self, now: float) -> dict[str, tuple[float, float]]: ...
    def set_peer_usage(self, usage: Mapping[str, tuple[float, float]], now: float) -> None: ...


def peer_totals(
    peers: Iterable[tuple[str, float, float, float]], half_life_s: float
) -> dict[str, tuple[float, float]]:
    """Sum other daemons' published usage per tenant, each (tenant, gpu_s, kv_token_s, age_s)
    row decayed by its age: the rest of the cluster's usage, as of now."""
    totals: dict[str, list[float]] = {}
    for tenant, gpu_s, kv_token_s, age_s in peers:
        f = decay_factor(age_s, half_life_s)
        t = totals.setdefault(tenant, [0.0, 0.0])
        t[0] += gpu_s * f
        t[1] += kv_token_s * f
    return {tenant: (gpu, kv) for tenant, (gpu, kv) in totals.items()}


class _Weights:
    __slots__ = ("_weights", "_default")

    # Meters that keep no decayed usage have nothing to share with a cluster.
    def local_usage(self, now: float) -> dict[str, tuple[float, float]]:
        return {}

    def set_peer_usage(self, usage: Mapping[str, tuple[float, float]], now: float) -> None:
        return None

    def __init__(self, weights: Mapping[str, float], default: float) -> None:
        self._weights: dict[str, float] = {}
        self._default = default
        for tenant, w in weights.items():
            self.set_weight(tenant, w)

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, self._default)

    def set_weight(self, tenant: str, weight: float) -> None:
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight of {tenant!r} must be a positive number")
        self._weights[tenant] = float(weight)


class NullMeter(_Weights):
    """No tenants: every score is 0 (fcfs, priority)."""

    def activate(self, tenant: str, active: Iterable[str], now: float) -> None:
        return None

    def charge(
        self, charges: Mapping[str, TenantCharge], elapsed_s: float, now: float, steps: int = 1
    ) -> None:
        return None

    def scores(self, tenants: Iterable[str], now: float) -> dict[str, float]:
        return dict.fromkeys(tenants, 0.0)

    def provisional(self, score: float, tenant: str, tokens: int, now: float) -> float:
        return score

    def reserve(self, tenant: str, context: int, prefill: int, decode: int) -> tuple[float, float]:
        return 0.0, 0.0

    def release(self, tenant: str, gpu_s: float, kv_token_s: float) -> None:
        return None


@dataclass(slots=True)
class _Usage:
    gpu_s: float = 0.0
    kv_token_s: float = 0.0
    at: float = 0.0  # time both values are decayed to

    def decayed_to(self, now: float, half_life_s: float) -> _Usage:
        """Both values decayed from `at` to `now` (in place); self."""
        if self.at != now:
            f = decay_factor(now - self.at, half_life_s)
            self.gpu_s *= f
            self.kv_token_s *= f
            self.at = now
        return self


class DrfMeter(_Weights):
    """Weighted DRF over compute and KV, decayed, with the idle-return lift."""

    __slots__ = (
        "_usage", "_half_life", "_kv_capacity", "_lift", "_s_prefill", "_s_decode", "_step_s",
        "_reserved", "_peers",
    )

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        default_weight: float,
        kv_capacity: int,
        half_life_s: float,
        lift: bool = True,
    ) -> None:
        super().__init__(weights, default_weight)
        self._usage: dict[str, _Usage] = {}
        self._half_life = half_life_s
        self._kv_capacity = float(kv_capacity)
        self._lift = lift
        # Running estimates of the GPU seconds a token is charged in steps
        # with prefill (many tokens share a step) and in decode-only steps.
        self._s_prefill = 1e-4
        self._s_decode = 1e-3
        self._step_s = 0.02
        # GPU seconds granted to admitted requests and not yet used: a
        # tenant's share counts the work it has been given, so one free
        # batch of slots is not handed to a single tenant.
        self._reserved: dict[str, list[float]] = {}  # tenant -> [gpu_s, kv_token_s]
        # The other daemons' usage on a shared queue (a cluster): it counts in
        # every score, so weights hold across the cluster, not per daemon.
        self._peers: dict[str, _Usage] = {}

    def _at(self, tenant: str, now: float) -> _Usage:
        usage = self._usage.get(tenant)
        if usage is None:
            usage = self._usage[tenant] = _Usage(at=now)
        return usage.decayed_to(now, self._half_life)

    def set_weight(self, tenant: str, weight: float) -> None:
        """Change a weight without a jump in the tenant's score.

        The usage is rescaled by new/old weight, so the score (usage over
        weight) is continuous: service splits by the new weights from now on,
        instead of the tenant whose weight rose being served alone until its
        old, larger usage is "earned back" (with a 600 s half-life, minutes).
        """
        old = self.weight(tenant)
        super().set_weight(tenant, weight)
        usage = self._usage.get(tenant) if hasattr(self, "_usage") else None
        if usage is None or old == weight:
            return
        factor = weight / old
        usage.gpu_s *= factor
        usage.kv_token_s *= factor
        reserved = self._reserved.get(tenant)
        if reserved is not None:
            reserved[0] *= factor
            reserved[1] *= factor

    def score(self, tenant: str, now: float, reserved: bool = True) -> float:
        """Weighted dominant use: used (here and by peers) plus, by default, reserved."""
        gpu, kv = self._others(tenant, now, reserved)
        u = self._at(tenant, now)
        return weighted_score(u.gpu_s + gpu, u.kv_token_s + kv, self._kv_capacity, self.weight(tenant))

    def _others(self, tenant: str, now: float, reserved: bool = True) -> tuple[float, float]:
        """What counts in the score besides this daemon's own usage: reservations and peers."""
        gpu = kv = 0.0
        res = self._reserved.get(tenant) if reserved else None
        if res is not None:
            gpu, kv = res
        peer = self._peers.get(tenant)
        if peer is not None:
            f = decay_factor(now - peer.at, self._half_life)
            gpu += peer.gpu_s * f
            kv += peer.kv_token_s * f
        return gpu, kv

    def local_usage(self, now: float) -> dict[str, tuple[float, float]]:
        """This daemon's own decayed usage per tenant (what it publishes to its peers)."""
        usage = {t: (u.gpu_s, u.kv_token_s) for t in list(self._usage) for u in (self._at(t, now),)}
        return {t: u for t, u in usage.items() if u != (0.0, 0.0)}

    def set_peer_usage(self, usage: Mapping[str, tuple[float, float]], now: float) -> None:
        """The rest of the cluster's usage per tenant, decayed to `now` (replaces the last)."""
        self._peers = {t: _Usage(gpu, kv, now) for t, (gpu, kv) in usage.items()}

    def scores(self, tenants: Iterable[str], now: float) -> dict[str, float]:
        return {t: self.score(t, now) for t in tenants}

    def activate(self, tenant: str, active: Iterable[str], now: float) -> None:
        # The lift compares what was used, not what was reserved: a tenant
        # returning to a machine full of another's admitted work is lifted
        # to that tenant's use so far, not to the use it is expected to make
        # (lifting to the reservations hands the other tenant a head start
        # of a whole batch of expected work).
        others = [self.score(t, now, reserved=False) for t in active if t != tenant]
        if not self._lift or not others:
            return
        floor = min(others)
        mine = self.score(tenant, now, reserved=False)
        factor = lift_factor(mine, floor)
        if factor == 1.0:
            return
        u = self._at(tenant, now)
        gpu, kv = self._others(tenant, now, reserved=False)
        # Only this daemon's own usage moves; what the others count stays.
        if math.isinf(factor):  # no usage at all: lift compute to the floor
            u.gpu_s = max(0.0, floor * self.weight(tenant) - gpu)
            u.kv_token_s = 0.0
        else:
            u.gpu_s = max(0.0, (u.gpu_s + gpu) * factor - gpu)
            u.kv_token_s = max(0.0, (u.kv_token_s + kv) * factor - kv)

    def charge(
        self, charges: Mapping[str, TenantCharge], elapsed_s: float, now: float, steps: int = 1
    ) -> None:
        prefill = decode = 0
        for tenant, c in charges.items():
            u = self._at(tenant, now)
            u.gpu_s += c.gpu_s
            u.kv_token_s += c.kv_token_s
            prefill += c.prefill_tokens
            decode += c.decode_tokens
        if prefill:
            self._s_prefill = 0.9 * self._s_prefill + 0.1 * elapsed_s / (prefill + decode)
        elif decode:
            self._s_decode = 0.9 * self._s_decode + 0.1 * elapsed_s / decode
            self._step_s = 0.9 * self._step_s + 0.1 * elapsed_s / steps

    def provisional(self, score: float, tenant: str, tokens: int, now: float) -> float:
        """Score after an admission, before any step ran it: the admitted
        request's reservation is already counted."""
        return self.score(tenant, now)

    def reserve(self, tenant: str, context: int, prefill: int, decode: int) -> tuple[float, float]:
        """Reserve what `prefill` + `decode` tokens of a request holding
        `context` tokens are expected to use: GPU seconds, and KV
        token-seconds for the decode steps. Returns both; the scheduler
        releases them as they are used or when the request leaves."""
        gpu = prefill * self._s_prefill + decode * self._s_decode
        kv = (context + decode / 2) * decode * self._step_s
        mine = self._reserved.get(tenant)
        if mine is None:
            mine = self._reserved[tenant] = [0.0, 0.0]
        mine[0] += gpu
        mine[1] += kv
        return gpu, kv

    def release(self, tenant: str, gpu_s: float, kv_token_s: float) -> None:
        """Give back reserved usage (used, or no longer needed)."""
        mine = self._reserved.get(tenant)
        if mine is not None:
            mine[0] = max(0.0, mine[0] - gpu_s)
            mine[1] = max(0.0, mine[1] - kv_token_s)


class TenantUsage:
    """Each tenant's decayed use, GPU seconds and KV token-seconds, on one half-life.

    What precedence reads (realtime and streaming use) and what a daemon
    reports as each tenant's served share: both decay here, as the meters do.
    """

    __slots__ = ("_usage", "_half_life")

    def __init__(self, half_life_s: float) -> None:
        self._usage: dict[str, _Usage] = {}
        self._half_life = half_life_s

    def charge(self, charges: Mapping[str, TenantCharge], now: float) -> None:
        for tenant, c in charges.items():
            u = self._usage.get(tenant)
            if u is None:
                u = self._usage[tenant] = _Usage(at=now)
            u = u.decayed_to(now, self._half_life)
            u.gpu_s += c.gpu_s
            u.kv_token_s += c.kv_token_s

    def of(self, tenant: str, now: float) -> tuple[float, float] | None:
        """(GPU s, KV token-s) of one tenant decayed to `now`; None for a tenant never charged."""
        u = self._usage.get(tenant)
        if u is None:
            return None
        u = u.decayed_to(now, self._half_life)
        return u.gpu_s, u.kv_token_s

    def totals(self, now: float) -> dict[str, tuple[float, float]]:
        """Every tenant's (GPU s, KV token-s), all decayed to `now`."""
        return {tenant: (u.gpu_s, u.kv_token_s)
                for tenant, u in ((t, u.decayed_to(now, self._half_life)) for t, u in self._usage.items())}


class PrecedenceUsage:
    """Each tenant's decayed use of the machine by realtime and streaming work,
    as a fraction of capacity: what class precedence gave it recently.

    The fraction is the tenant's dominant use (`shares.dominant_use`) over
    the decayed engine time of the same window, independent of the other
    tenants. Until that window reaches `warmup_s` it is read as `warmup_s`
    long (`precedence_window`): in a run's first seconds one long prompt
    would otherwise be most of the window.
    """

    __slots__ = ("_usage", "_elapsed", "_half_life", "_kv_capacity", "_warmup")

    def __init__(self, *, kv_capacity: int, half_life_s: float, warmup_s: float = 0.0) -> None:
        self._usage = TenantUsage(half_life_s)
        self._elapsed = _Usage()  # gpu_s holds the decayed engine seconds
        self._half_life = half_life_s
        self._kv_capacity = float(kv_capacity)
        self._warmup = warmup_s

    @classmethod
    def of_config(cls, config: SchedulerConfig) -> PrecedenceUsage:
        """The measure a scheduler with `config` keeps."""
        return cls(kv_capacity=config.kv_tokens, half_life_s=config.usage_half_life_s,
                   warmup_s=config.precedence_warmup_s)

    def charge(self, charges: Mapping[str, TenantCharge], elapsed_s: float, now: float) -> None:
        self._elapsed.decayed_to(now, self._half_life).gpu_s += elapsed_s
        self._usage.charge(charges, now)

    def fraction(self, tenant: str, now: float) -> float:
        """The tenant's recent precedence use as a fraction of the machine (0 when none)."""
        window = precedence_window(self._elapsed.decayed_to(now, self._half_life).gpu_s, self._warmup)
        used = self._usage.of(tenant, now)
        if used is None or window <= 0:
            return 0.0
        return dominant_use(used[0], used[1], self._kv_capacity, window)


def precedence_window(elapsed_s: float, warmup_s: float) -> float:
    """The window a tenant's precedence use is a fraction of: the decayed engine seconds, at
    least `warmup_s`. A tenant may then take through precedence at most its share of the
    first `warmup_s` seconds, as of any later window: a bounded head start, not a way round
    the weights."""
    return max(elapsed_s, warmup_s)


class VtcMeter(_Weights):
    """Virtual Token Counter (Sheng et al., OSDI 2024), weighted.

    counter += (input_tokens * w_in + output_tokens * w_out) / weight, with
    w_in = 1, w_out = 2 as in the paper; a tenant that becomes active is
    lifted to the lowest counter among the active tenants.
    """

    __slots__ = ("_counters", "_lift")
    W_IN = 1.0
    W_OUT = 2.0

    def __init__(
        self, weights: Mapping[str, float], *, default_weight: float, lift: bool = True
    ) -> None:
        super().__init__(weights, default_weight)
        self._counters: dict[str, float] = {}
        self._lift = lift

    def scores(self, tenants: Iterable[str], now: float) -> dict[str, float]:
        return {t: self._counters.get(t, 0.0) for t in tenants}

    def activate(self, tenant: str, active: Iterable[str], now: float) -> None:
        others = [self._counters.get(t, 0.0) for t in active if t != tenant]
        if self._lift and others:
            self._counters[tenant] = max(self._counters.get(tenant, 0.0), min(others))

    def charge(
        self, charges: Mapping[str, TenantCharge], elapsed_s: float, now: float, steps: int = 1
    ) -> None:
        for tenant, c in charges.items():
            cost = c.prefill_tokens * self.W_IN + c.decode_tokens * self.W_OUT
            self._counters[tenant] = self._counters.get(tenant, 0.0) + cost / self.weight(tenant)

    def provisional(self, score: float, tenant: str, tokens: int, now: float) -> float:
        """Within one schedule() call, count the admitted prompt at once."""
        return score + tokens * self.W_IN / self.weight(tenant)

    def reserve(self, tenant: str, context: int, prefill: int, decode: int) -> tuple[float, float]:
        return 0.0, 0.0  # VTC charges tokens as they are processed, nothing ahead

    def release(self, tenant: str, gpu_s: float, kv_token_s: float) -> None:
        return None
