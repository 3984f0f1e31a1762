"""A step's accounting, made in one tight pass a step, charges what a row-at-a-time reading of the
rules charges, to the last bit; and a plan's decode rows are the requests with no prefill pending."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fsched.core.sched.accounting import TenantStep, apply_step
from fsched.core.sched.plan import Outcome, Plan, PrefillChunk
from fsched.core.sched.planning import split_rows
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass

CLASSES = list(RequestClass)


def reference_step(running: list[Request], plan: Plan, outcome: Outcome) -> dict[str, TenantStep]:
    """The rules, one row at a time: each decode row yields `tokens_of` tokens, a chunk its tokens (and
    its token when it completes the prefill); a step's time is shared by the tokens processed, KV is
    charged as held x time, and an admitted request's reservation is used up first."""
    steps, elapsed = outcome.steps, outcome.elapsed_s
    processed = sum(c.tokens for c in plan.prefill) + sum(outcome.tokens_of(rid) for rid in plan.decode)
    per_token = elapsed / processed if processed else 0.0
    chunks = {c.request_id: c for c in plan.prefill}
    totals: dict[str, TenantStep] = {}
    for r in running:
        t = totals.setdefault(r.tenant, TenantStep())
        before, gpu = r.generated, 0
        if r.id in plan.decode:
            gpu = outcome.tokens_of(r.id)
            r.computed += gpu
            r.generated += gpu
            t.charge.decode_tokens += gpu
            held = r.computed - (steps - 1) / 2
        elif r.id in chunks:
            gpu = chunks[r.id].tokens
            r.computed += gpu
            t.charge.prefill_tokens += gpu
            if chunks[r.id].produces_token:
                r.generated += outcome.tokens_of(r.id)
            held = r.computed
        else:
            held = r.computed
        t.generated += r.generated - before
        r.run_steps, r.idle_steps = (r.run_steps + steps, 0) if gpu else (r.run_steps, r.idle_steps + steps)
        gpu, kv = gpu * per_token, held * elapsed
        t.charge.gpu_s += gpu
        t.charge.kv_token_s += kv
        if r.request_class is not RequestClass.BATCH:
            t.precedence.gpu_s += gpu
            t.precedence.kv_token_s += kv
        if r.res_gpu or r.res_kv:
            used_gpu, used_kv = min(gpu, r.res_gpu), min(kv, r.res_kv)
            r.res_gpu -= used_gpu
            r.res_kv -= used_kv
            t.reserved_gpu_s += used_gpu
            t.reserved_kv_token_s += used_kv
    return totals


row = st.tuples(st.integers(0, 3), st.sampled_from(CLASSES), st.sampled_from(["decode", "chunk", "idle"]),
                st.integers(0, 3), st.floats(0, 0.01), st.floats(0, 50.0))


def rows_of(spec) -> tuple[list[Request], Plan, dict]:
    running, decode, prefill, produced = [], [], [], {}
    for i, (tenant, cls, kind, tokens, res_gpu, res_kv) in enumerate(spec):
        r = Request(f"r{i}", f"t{tenant}", cls, 10 + i, 64, 0.0)
        decoding = kind == "decode"
        r.computed, r.generated = (r.context - 1, 1) if decoding else (0, 0)
        r.res_gpu, r.res_kv = res_gpu, res_kv
        running.append(r)
        if kind == "decode":
            decode.append(r.id)
            if tokens:  # a row the runner reports nothing for yields nothing
                produced[r.id] = tokens
        elif kind == "chunk":
            prefill.append(PrefillChunk(r.id, 0, r.prompt_tokens - tokens % 2, tokens % 2 == 0))
            produced[r.id] = 1
    return running, Plan(step=0, prefill=tuple(prefill), decode=tuple(decode)), produced


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=1, max_size=12), st.integers(1, 3), st.floats(1e-4, 0.5), st.booleans())
def test_a_step_charges_what_a_row_at_a_time_charges_to_the_bit(spec, steps, elapsed, reported):
    ours, plan, produced = rows_of(spec)
    theirs, _, _ = rows_of(spec)
    steps = 1 if plan.prefill else steps
    outcome = Outcome(elapsed_s=elapsed, produced=produced if reported else None, steps=steps)
    assert apply_step(ours, plan, outcome) == reference_step(theirs, plan, outcome)
    fields = ("computed", "generated", "run_steps", "idle_steps", "res_gpu", "res_kv")
    def state(rows):
        return [[getattr(r, f) for f in fields] for r in rows]

    assert state(ours) == state(theirs)


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 4), st.integers(0, 9)), min_size=1, max_size=10))
def test_the_decode_rows_are_the_requests_with_no_prefill_pending(spec):
    running = []
    for i, (prompt, generated, computed) in enumerate(spec):
        r = Request(f"r{i}", "a", RequestClass.BATCH, prompt, 8, 0.0)
        r.generated, r.computed = generated, min(computed, prompt + generated)
        running.append(r)
    decode, _ = split_rows(running, lambda r: (r.id,), budget=10_000, min_quantum=16)
    assert decode == [r.id for r in running if r.pending_prefill == 0]


def test_tokens_of_all_is_the_sum_of_tokens_of():
    from fsched.core.sched.plan import Outcome

    ids = ["a", "b", "c"]
    for outcome in (Outcome(0.1, steps=3), Outcome(0.1, produced={"a": 2, "c": 5})):
        assert outcome.tokens_of_all(ids) == sum(outcome.tokens_of(i) for i in ids)
    assert Outcome(0.1, produced={"a": 2}).tokens_of_all([]) == 0
