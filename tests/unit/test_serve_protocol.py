"""serve's HTTP protocol: uvicorn's httptools one where httptools is installed, h11's else, both under
the client deadlines."""

from __future__ import annotations

import pytest

from fsched.api.slowclients import HeaderDeadline, header_deadline_protocol


def test_httptools_where_installed_and_h11_when_asked():
    pytest.importorskip("httptools")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    fast = header_deadline_protocol(5.0)
    assert issubclass(fast, HttpToolsProtocol) and fast.header_timeout_s == 5.0
    plain = header_deadline_protocol(7.0, "h11")
    assert issubclass(plain, HeaderDeadline) and plain.header_timeout_s == 7.0


def test_serve_freezes_its_startup_heap_and_collects_young_objects_less_often():
    import gc

    from fsched.cli.serve import YOUNG_GC_THRESHOLD, quiet_gc

    before = gc.get_threshold()
    try:
        quiet_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
