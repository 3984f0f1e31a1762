"""What a daemon publishes in its heartbeat, read back by `/metrics`: the real daemon, the in-memory
queue, the stand-in runner, on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fsched.core.ports.memory import MemoryQueueStore
from fsched.core.types import RequestClass

from ..fakes import FakeClock
from .test_daemon_queue import Rig, job

pytest.importorskip("prometheus_client")


class TableOf:
    """The catalog and serving reads `/metrics` makes, over a memory queue's daemons."""

    def __init__(self, store: MemoryQueueStore):
        self.store = store

    def list_jobs(self, include_finished=True):
        return []

    def list_tenants(self):
        return []

    def list_daemons(self):
        # As the SQL store reads them: each heartbeat's age on the table's clock.
        now = self.store.clock()
        return [replace(d, heartbeat_age_s=now - d.heartbeat_at) for d in self.store.daemons.values()]

    def tenant_totals(self):
        return []


def test_a_daemon_that_preempted_shows_its_preemptions_on_metrics():
    from fsched.api.metrics import Metrics
    from fsched.api.state import Backend

    clock = FakeClock(tick=0.001)
    store = MemoryQueueStore(clock)
    store.submit([job(4, seed=11)])  # batch work fills the batch of two
    rig = Rig(store, clock, max_batch=2)
    rig.daemon.sync()
    for _ in range(3):
        rig.daemon.turn()
    store.submit([job(2, seed=12, tenant="bob", request_class=RequestClass.REALTIME)])
    rig.daemon.sync()
    for _ in range(3):
        rig.daemon.turn()
    preempted = rig.engine.scheduler.preemptions
    assert preempted > 0  # realtime work displaced batch work
    clock.advance(5.0)
    rig.daemon.turn()  # the heartbeat after it is due
    table = TableOf(store)
    backend = Backend(jobs=table, keys=None, files=None, serving=table)
    text = Metrics(backend).render().decode()
    assert f'fsched:num_preemptions_total{{daemon="d1"}} {float(preempted)}' in text, text
