"""The replayer's client against a real HTTP engine (the paced stand-in, in this process): an engine
alone, with neither keys nor /tokenize, and an address where nothing listens."""

from __future__ import annotations

import asyncio

import pytest

from fsched.core.replay.driver import ReplayError, connect, replay
from fsched.core.replay.http import ServerAddress
from fsched.core.replay.plan import send_plan
from fsched.core.replay.report import live_report
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sim.costmodel import paced_profile
from fsched.core.sim.simulator import simulate
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass
from tests.support.paced_engine import PacedEngine
from tests.support.ports import free_port

STEP_S = 0.01


def trace() -> list[TraceRequest]:
    classes = [RequestClass.REALTIME, RequestClass.STREAMING, RequestClass.BATCH]
    return [TraceRequest(0.02 * i, "ab"[i % 2], classes[i % 3], 20 + i, 4 + 3 * (i % 5)) for i in range(12)]


def run(url: str, requests: list[TraceRequest], chat: bool = True):
    async def go():
        target = await connect(ServerAddress.parse(url), {"a": "", "b": ""}, None, chat)
        return target, await replay(target, send_plan(requests))

    return asyncio.run(go())


def test_an_engine_alone_serves_every_request_at_its_length_no_sooner_than_its_pace():
    requests = trace()
    with PacedEngine(slots=2, step_s=STEP_S) as engine:
        target, observed = run(engine.url, requests)
    assert target.model == "paced-engine" and not target.shape.measured  # no /tokenize: approximated
    assert target.forcing.ignore_eos and target.forcing.min_tokens
    assert all(o.completed for o in observed), [o.error for o in observed]
    assert [o.output_tokens for o in observed] == [r.output_tokens for r in requests]
    # A request joins at the engine's next step and gets a token each step after: its last token comes
    # more than (tokens - 1) steps after it was sent (the client only ever sees them later still).
    for o in observed:
        assert o.sent_s < o.first_token_s <= o.finish_s
        assert o.finish_s - o.sent_s >= (o.output_tokens - 1) * STEP_S
    run_report = live_report("alone", observed, {"a": 1, "b": 1}, url=engine.url, model=target.model,
                             prompt_sizing=target.shape.describe(), forcing=target.forcing.describe())
    assert (run_report.completed, run_report.failed, run_report.refused) == (12, 0, 0)
    # Two slots serve the whole trace no faster than the simulator's engine of the same pace does.
    simulated = simulate(requests, "fcfs", cost=paced_profile(STEP_S), config=SchedulerConfig(max_batch=2))
    assert run_report.report.makespan_s >= simulated.makespan_s - 2 * STEP_S


def test_completions_to_an_engine_without_text_prompts_are_refused_one_by_one():
    """The paced engine takes token ids only on /v1/completions: the probe finds no request it takes."""
    with PacedEngine(slots=2, step_s=STEP_S) as engine, pytest.raises(ReplayError, match="refuses"):
        run(engine.url, trace()[:2], chat=False)


def test_an_address_where_nothing_listens_is_one_clear_error():
    port = free_port()  # nothing listens there, and no client socket takes it meanwhile
    with pytest.raises(ReplayError, match=f"cannot connect to http://127.0.0.1:{port}"):
        run(f"http://127.0.0.1:{port}", trace()[:1])
