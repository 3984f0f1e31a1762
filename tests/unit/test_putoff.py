"""The put-off rule: fresh latency work's step goes before housekeeping, for one limit at most."""

from __future__ import annotations

from fsched.core.daemon.putoff import PutOff
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass


def request(cls: RequestClass) -> Request:
    return Request(id=1, tenant="a", request_class=cls, prompt_tokens=4, max_tokens=4, arrival=0.0)


def test_latency_work_puts_housekeeping_off_and_batch_work_does_not():
    rule = PutOff(limit_s=0.1)
    rule.claimed([request(RequestClass.BATCH)])
    assert not rule.puts_off(0.0) and not rule.hurrying
    rule.claimed([request(RequestClass.BATCH), request(RequestClass.REALTIME)])
    assert rule.puts_off(0.0) and rule.hurrying


def test_a_step_that_took_the_work_to_the_engine_ends_the_hurry():
    rule = PutOff(limit_s=0.1)
    rule.claimed([request(RequestClass.STREAMING)])
    assert rule.puts_off(0.0)
    rule.stepping()
    assert not rule.puts_off(0.01) and not rule.hurrying


def test_arrivals_put_it_off_for_the_limit_at_most():
    rule = PutOff(limit_s=0.1)
    for now in (0.0, 0.05, 0.09):
        rule.stepping()
        rule.claimed([request(RequestClass.REALTIME)])
        assert rule.puts_off(now)
    rule.stepping()
    rule.claimed([request(RequestClass.REALTIME)])
    assert not rule.puts_off(0.1)  # housekeeping runs now, whatever keeps arriving
    rule.claimed([request(RequestClass.REALTIME)])
    assert rule.puts_off(0.11)  # and a new period may begin


def test_an_idle_engine_ends_the_hurry():
    rule = PutOff(limit_s=0.1)
    rule.claimed([request(RequestClass.REALTIME)])
    assert rule.puts_off(0.0)
    rule.idle()
    assert not rule.hurrying
