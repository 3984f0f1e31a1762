"""`fsched serve`'s options refused before anything is bound or forked (in process, an in-memory table)."""

from __future__ import annotations

import pytest

from tests.support.cli import Commands


@pytest.mark.parametrize(("args", "said"), [
    (("--workers", "0"), "--workers must be within 1..64, got 0"),
    (("--workers", "65"), "--workers must be within 1..64, got 65"),
    (("--port", "8001", "--metrics-port", "8000", "--workers", "2"),
     "with --workers 2, ports 8000..8001 serve the workers' /metrics"),
    (("--port", "8000", "--metrics-port", "8000"), "--metrics-port must differ from --port"),
    (("--metrics-port", "65535", "--workers", "2"), "the last worker's would be 65536, past 65535"),
    (("--workers", "2"), "--workers: an in-memory table lives in one process"),
])
def test_a_refused_option_says_why_and_serves_nothing(args, said):
    ran = Commands().run("serve", *args)
    assert ran.returncode == 1
    assert said in ran.stderr.decode()
