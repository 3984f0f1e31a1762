"""The chaos suite's fixtures; its `--long` option is defined in tests/conftest.py.

    pytest tests/chaos                       # the quick suite (part of every run)
    pytest tests/chaos --long 600            # plus 10 minutes of random kills
"""

from __future__ import annotations

import pytest

from tests.support.model_cache import shared_model_cache


@pytest.fixture
def long_seconds(request) -> float:
    seconds = request.config.getoption("--long", default=0.0)
    if not seconds:
        pytest.skip("the long chaos loop runs only with --long SECONDS")
    return seconds


@pytest.fixture(scope="session")
def tiny_model_cache(tmp_path_factory) -> str:
    """One tiny model for the daemons of this session (the first one builds it)."""
    return shared_model_cache(tmp_path_factory)
