"""`fsched status` and `status --watch` in a real terminal (tmux) at 80x24 and 120x40: every table whole
(no header cut, no border wrapped), the legend saying what was left out.

One job table with files, online requests and a live stand-in daemon (slow steps, so work is running
and waiting while the screens are read) serves the module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from .conftest import FSCHED
from .http_server import Server, make_server

TMUX = shutil.which("tmux")
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(TMUX is None, reason="needs tmux (apt-get install -y tmux)")]


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Server:
    root = tmp_path_factory.mktemp("terminal")
    s = make_server(root)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    work = "".join(json.dumps({"prompt": f"d{i}", "max_tokens": 300}) + "\n" for i in range(30))
    s.seed({"alice": 3.0, "bob": 1.0}, [("alice", "nightly-summaries-of-the-whole-corpus", work),
                                        ("bob", "tickets", work)])
    add_online_requests(s.env["FSCHED_DB"])
    s.start_daemon("--model", "standin:500ms", "--max-batch", "4")
    deadline = time.time() + 60
    while '"alive": true' not in s.cli("status", "--json") and time.time() < deadline:
        time.sleep(0.2)
    yield s
    s.stop()


def add_online_requests(url: str) -> None:
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission
    from fsched.core.types import JobOrigin, RequestClass
    from fsched.storage.jobstore import SqlJobStore

    store = SqlJobStore(url)
    one = parse_job_file(b'{"prompt": "hi", "max_tokens": 4}\n', "<http>")
    key = "5b0ba172f1b6"
    store.submit([JobSubmission(one, "bob", RequestClass.REALTIME, 5, "http", JobOrigin.ONLINE, key)
                  for _ in range(5)])
    store.db.dispose()


def screen(table: Server, command: str, width: int, height: int, ready=None) -> str:
    """What a `width`x`height` terminal shows (with its scrollback) once `command` has ended, or, for
    one that runs on, once what it shows satisfies `ready` (read again and again, up to 60 s)."""
    script = Path(table.root) / f"run-{uuid.uuid4().hex[:6]}.sh"
    ended = script.with_suffix(".ended")
    env = " ".join(f"{k}='{v}'" for k, v in table.env.items() if k.startswith(("FSCHED_", "XDG_", "HOME",
                                                                                "PATH", "USER", "LOGNAME")))
    script.write_text(f"#!/bin/sh\nunset COLUMNS LINES\nexport {env} TERM=xterm-256color\n"
                      f"{FSCHED} {command}\ntouch {ended}\nsleep 60\n")
    script.chmod(0o755)
    socket = f"fsched-test-{uuid.uuid4().hex[:8]}"
    tmux = [TMUX, "-L", socket, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-x", str(width), "-y", str(height), str(script)], check=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            done = ended.exists()
            text = subprocess.run([*tmux, "capture-pane", "-p", "-S", "-200"], capture_output=True,
                                  text=True, check=True).stdout
            if done or (ready is not None and ready(text)) or time.monotonic() > deadline:
                return text  # past the deadline: the test's assertions show what was there
            time.sleep(0.2)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def whole_frame(text: str) -> bool:
    """A live view's frame drawn to its end: every table it began closed, the shares among them."""
    lines = [line.lstrip() for line in text.splitlines()]
    tops, bottoms = (sum(line.startswith(c) for line in lines) for c in "┏└")
    return "Tenants" in text and tops >= 2 and tops == bottoms


def check_whole_tables(text: str, width: int) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    tops = [i for i, line in enumerate(lines) if line.startswith("┏")]
    assert tops, text
    headers = []
    for i in tops:
        assert lines[i].endswith("┓"), f"a table wider than {width} columns wrapped:\n{text}"
        assert "…" not in lines[i + 1], f"a header was cut: {lines[i + 1]!r}"
        headers.append(lines[i + 1])
    assert all(len(line) <= width for line in lines)
    return headers


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40)])
def test_status_fits_the_terminal(table, width, height):
    text = screen(table, "status", width, height)
    headers = check_whole_tables(text, width)
    assert len(headers) == 5, text  # jobs, tenants, online requests, why, daemons
    assert "Online requests" in text and "5b0ba172f1b6" in text
    assert "nightly-" in text  # a long name is cut, never the headers
    assert ("entitled: weight" in text) and ("served recently" in text)
    if width == 80:
        assert "not shown at this width" in text and "--wide shows all" in text


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40)])
def test_status_watch_fits_the_terminal(table, width, height):
    text = screen(table, "status --watch --interval 0.5", width, height,
                  ready=lambda t: whole_frame(t) and (height != 24 or "more part(s) below" in t))
    visible = [line for line in text.splitlines() if line.strip()]
    assert len(visible) <= height
    headers = check_whole_tables(text, width)
    assert len(headers) >= 2 and "Jobs" in text and "Tenants" in text  # the shares always fit
    if height == 24:
        assert "more part(s) below" in text
