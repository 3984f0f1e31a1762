"""core/stamps.py: off, a stamp writes nothing; on, each is one line `stage job_id wall_time`."""

from __future__ import annotations

import io

from fsched.core import stamps


def test_a_stamp_is_one_line_of_stage_job_and_time_when_on_and_nothing_when_off(monkeypatch):
    monkeypatch.setattr(stamps, "_file", None)
    stamps.stamp("stored", 7)  # off: no file to write to, and no error
    assert not stamps.enabled()
    out = io.StringIO()
    monkeypatch.setattr(stamps, "_file", out)
    assert stamps.enabled()
    stamps.stamp("stored", 7, at=12.5)
    stamps.stamp("claimed", 7)
    first, second = out.getvalue().splitlines()
    assert first == "stored 7 12.500000"
    stage, job, at = second.split()
    assert (stage, job) == ("claimed", "7") and float(at) > 12.5


def test_a_clients_tag_is_stamped_with_its_job_only_when_on_and_only_a_number(monkeypatch):
    monkeypatch.setattr(stamps, "_file", None)
    stamps.tag(7, "12")  # off: nothing, no error
    out = io.StringIO()
    monkeypatch.setattr(stamps, "_file", out)
    stamps.tag(7, "12")
    stamps.tag(8, None)  # the client sent no tag
    stamps.tag(9, "12\n34 5")  # not a number: nothing a reader could misparse
    stamps.tag(10, "\u00b2")  # a digit, not an ASCII one
    stamps.stamp_tagged("client_engine_arrived", "12")
    stamps.stamp_tagged("client_engine_arrived", "x")
    first, second = out.getvalue().splitlines()
    assert first == "tag 7 12" and second.startswith("client_engine_arrived 12 ")
