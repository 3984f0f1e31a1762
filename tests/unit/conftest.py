"""tests/unit is pure: a unit test that opens a socket, starts a subprocess, sleeps or opens a
database fails (tests/support/purity.py). What needs those belongs in tests/integration."""

from __future__ import annotations

import pytest

from tests.support.purity import PurityGuard

_guard = PurityGuard()
_patch = pytest.MonkeyPatch()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _patch.undo()
    _guard.installed = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    return (yield from _guarded(item))


def _guarded(item: pytest.Item):
    if not _guard.installed:
        _guard.install(_patch)
    _guard.watch()
    try:
        result = yield
    finally:
        found = _guard.release()
    if found:
        pytest.fail(f"{item.nodeid}: " + "; ".join(dict.fromkeys(found)), pytrace=False)
    return result
