"""A stand-in daemon in a thread, for in-process API tests over a real job table: it heartbeats,
claims whatever is queued and ends it at once with a given text."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from fsched.core.ports.records import Completion, DaemonStats, DaemonSummary
from fsched.core.types import RequestStatus


def _serve(queue, text: str, stop: threading.Event, beating: threading.Event) -> None:
    while not stop.is_set():
        queue.heartbeat(DaemonSummary("thread-daemon", "host", 1, "cpu", "m", time.time(), time.time(), None,
                                      DaemonStats()))
        beating.set()
        claimed = queue.claim("thread-daemon", per_group=100)
        if claimed:
            queue.finish_requests([Completion(c.id, RequestStatus.FINISHED_STOPPED, (1, 2), text,
                                              lease_epoch=c.lease_epoch) for c in claimed], "thread-daemon")
        time.sleep(0.01)


@contextlib.contextmanager
def answering(queue, text: str = "ok") -> Iterator[None]:
    """While inside: every request of the table's queue is answered `text`.

    It is entered once the daemon's first heartbeat is in the table: a server asked before then would
    answer that no daemon serves the table."""
    stop, beating = threading.Event(), threading.Event()
    worker = threading.Thread(target=_serve, args=(queue, text, stop, beating), daemon=True)
    worker.start()
    try:
        while not beating.wait(0.05):
            assert worker.is_alive(), "the thread daemon stopped before its first heartbeat"
        yield
    finally:
        stop.set()
        worker.join()
