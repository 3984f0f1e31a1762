"""When a daemon renews its leases: once a part of each has passed, not every heartbeat."""

from __future__ import annotations

from fsched.core.daemon.leases import LeaseKeeper, due_leases


def test_a_lease_is_due_once_its_part_has_passed():
    renewed = {"a": 0.0, "b": 2.4, "c": 2.5, "d": 9.0}
    assert due_leases(renewed, now=5.0, lease_s=10.0, renew_after=0.25) == {"a", "b", "c"}
    assert due_leases(renewed, now=5.0, lease_s=10.0, renew_after=0.5) == {"a"}
    assert due_leases({}, now=5.0, lease_s=10.0) == set()


class Store:
    def __init__(self):
        self.calls: list[dict] = []
        self.taken: set[str] = set()  # leases another daemon took

    def renew_leases(self, owner, leases, lease_s):
        self.calls.append(dict(leases))
        return set(leases) - self.taken


class Held:
    def __init__(self, leases):
        self.held = dict(leases)

    def leases(self):
        return dict(self.held)

    def pop(self, request_id):
        return self.held.pop(request_id, None)


class Engine:
    def __init__(self):
        self.cancelled = []

    def cancel(self, request_id):
        self.cancelled.append(request_id)


def keeper(held, pending=None):
    store, engine = Store(), Engine()
    return store, engine, LeaseKeeper(store, engine, "d1", 10.0, held, lambda: dict(pending or {}))


def test_heartbeats_renew_each_lease_once_a_quarter_of_it_passed_and_new_ones_from_the_last_pass():
    held = Held({"a": 1, "b": 1})
    store, _, keep = keeper(held, pending={"p": 3})
    keep.renew(0.0)  # first pass: nothing known, everything renewed
    assert store.calls == [{"a": 1, "b": 1, "p": 3}]
    held.held["c"] = 1  # claimed between the passes at 0 and 1
    for now in (1.0, 2.0):
        keep.renew(now)
    assert len(store.calls) == 1  # nothing due yet, not even "c": claimed after 0, not due before 2.5
    keep.renew(3.0)
    assert store.calls[-1] == {"a": 1, "b": 1, "c": 1, "p": 3}
    held.held["a"] = 2  # taken again under a new epoch: a new lease, known only since the last pass (3)
    keep.renew(4.0)
    keep.renew(5.0)
    assert len(store.calls) == 2
    keep.renew(6.0)
    assert store.calls[1:] == [{"a": 1, "b": 1, "c": 1, "p": 3}, {"a": 2, "b": 1, "c": 1, "p": 3}]


def test_a_stall_makes_every_lease_due_and_the_lost_ones_are_dropped():
    held = Held({"a": 1, "b": 1})
    store, engine, keep = keeper(held)
    keep.renew(0.0)
    store.taken = {"b"}  # the daemon stalled 30 s; another daemon took "b"
    keep.renew(30.0)
    assert store.calls[-1] == {"a": 1, "b": 1}
    assert engine.cancelled == ["b"] and keep.lost == 1 and held.leases() == {"a": 1}
