"""`fsched generate`'s wait loop and figures, over a scripted fake store (no daemon, no database)."""

from __future__ import annotations

import time

import pytest
import typer

from fsched.cli import generate as gen
from fsched.core.ports.records import DaemonStats, DaemonSummary, RequestProgress
from fsched.core.types import RequestStatus


def progress(text: str, state=RequestStatus.RUNNING, tokens=None, first=None, finished=None):
    return RequestProgress(id=7, job_id=3, status=state, output_text=text,
                           num_output_tokens=len(text) if tokens is None else tokens, enqueued_at=100.0,
                           first_token_at=first, finished_at=finished, error=None)


class ScriptedStore:
    """Answers each poll with the next scripted progress (the last one repeats)."""

    def __init__(self, script: list[RequestProgress], daemon_alive: bool = True):
        self.script, self.polls, self.cancelled = script, 0, []
        now = time.time()
        self.daemons = [DaemonSummary("d", "h", 1, "cpu", "m", now, now, None, DaemonStats())] \
            if daemon_alive else []

    def request_progress(self, job_id):
        p = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        return [p]

    def list_daemons(self):
        return self.daemons

    def cancel_job(self, job_id):
        self.cancelled.append(job_id)


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(gen, "POLL_S", 0.001)


def test_stream_prints_new_text_and_holds_back_a_half_decoded_character(capsys):
    store = ScriptedStore([progress(""), progress("He"), progress("Hello caf\ufffd"),
                           progress("Hello café w"),
                           progress("Hello café world", RequestStatus.FINISHED_STOPPED)])
    final = gen._wait(store, 3, stream=True, timeout=None)
    out, err = capsys.readouterr()
    assert out == "Hello café world" and final.output_text == out
    assert err == "" and store.cancelled == []


def test_without_stream_prints_nothing_while_waiting(capsys):
    store = ScriptedStore([progress("a"), progress("ab", RequestStatus.FINISHED_STOPPED)])
    assert gen._wait(store, 3, stream=False, timeout=None).output_text == "ab"
    assert capsys.readouterr().out == ""


def test_no_daemon_warns_once_then_the_timeout_cancels(capsys):
    store = ScriptedStore([progress("", RequestStatus.WAITING)], daemon_alive=False)
    with pytest.raises(typer.Exit) as exit_:
        gen._wait(store, 3, stream=False, timeout=0.05)
    err = capsys.readouterr().err
    assert exit_.value.exit_code == 1 and store.cancelled == [3]
    assert err.count("no daemon is running") == 1
    assert "fsched: error: no answer within 0.05 s; job 3 cancelled" in err


def test_a_failed_request_is_an_error():
    failed = RequestProgress(7, 3, RequestStatus.FINISHED_FAILED, "", 0, 100.0, None, 101.0,
                             "prompt too long")
    with pytest.raises(typer.Exit):
        gen._wait(ScriptedStore([failed]), 3, stream=False, timeout=None)


def test_answer_figures():
    done = progress("x" * 11, RequestStatus.FINISHED_STOPPED, tokens=11, first=100.25, finished=100.75)
    o = gen.answer_of(done)
    assert (o.ttft_ms, o.tok_s, o.total_ms, o.tokens) == (250.0, 20.0, 750.0, 11)
    assert gen.answer_of(progress("", RequestStatus.WAITING)).ttft_ms is None
    one = progress("x", RequestStatus.FINISHED_STOPPED, tokens=1, first=100.1, finished=100.1)
    assert gen.answer_of(one).tok_s is None
