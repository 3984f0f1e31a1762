"""One first-token clock: the engine stamps a request's first token once, on its own clock, on the
request's record; the daemon's holdings give that time on the daemon's wall clock where it is written."""

from __future__ import annotations

from fsched.core.daemon.engine import Engine
from fsched.core.daemon.holdings import Holdings
from fsched.core.runners.standin import StandInRunner
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.request import Request
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import SamplingParams


def test_the_engine_stamps_the_first_token_once_on_its_clock_and_the_daemon_reads_it_in_wall_time():
    clock = [50.0]
    engine = Engine(StandInRunner(context_length=256), Scheduler(SchedulerConfig(max_batch=4), "fcfs"), 256,
                    clock=lambda: clock[0])
    request = Request.to_run("r", [7] * 4, SamplingParams(max_tokens=3, temperature=0))
    engine.add(request, queued_s=2.0)
    assert (request.queued_from, request.first_token_at) == (48.0, None)
    clock[0] = 50.5
    first = engine.step()
    assert first.at == 50.5 and request.first_token_at == 50.5
    clock[0] = 51.0
    engine.step()
    assert request.first_token_at == 50.5  # stamped once, not at each token

    held = Holdings()
    held.add(request)
    assert held.first_token_at(request) == 50.5  # no step seen yet: no offset
    held.stepped(wall_now=1_000.5, engine_now=first.at)
    assert held.first_token_at(request) == 1_000.5
    held.stepped(wall_now=2_000.0, engine_now=None)  # a step that ran nothing says nothing
    assert held.first_token_at(request) == 1_000.5
    assert held.first_token_at(Request.to_run("s", [7], SamplingParams(max_tokens=1))) is None
