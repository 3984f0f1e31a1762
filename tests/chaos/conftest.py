"""The chaos suite's options: `--long` turns on the endless-until-told variant.

    pytest tests/chaos                       # the quick suite (part of every run)
    pytest tests/chaos --long 600            # plus 10 minutes of random kills
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "fsched reliability suite")
    group.addoption(
        "--long", type=float, default=0.0, metavar="SECONDS",
        help="run the long chaos loop (tests/chaos/test_long.py) for this many seconds",
    )
    group.addoption("--chaos-seed", type=int, default=None, help="seed of the long loop (default: random)")


@pytest.fixture
def long_seconds(request) -> float:
    seconds = request.config.getoption("--long", default=0.0)
    if not seconds:
        pytest.skip("the long chaos loop runs only with --long SECONDS")
    return seconds


@pytest.fixture(scope="session")
def tiny_model_cache(tmp_path_factory) -> str:
    """One tiny model for the daemons of this session (the first one builds it)."""
    return str(tmp_path_factory.mktemp("model-cache"))
