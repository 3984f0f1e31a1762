"""An engine's absences: one outage counted once, probes backing off to their bound, its length when over."""

from fsched.core.runners.outage import Outage


def test_an_outage_is_counted_once_and_probed_with_a_doubling_backoff_up_to_its_bound():
    outage = Outage((0.5, 2.0))
    assert not outage.probe_due(100.0)  # the engine answers: nothing to probe
    assert outage.began(100.0) and not outage.began(100.2)
    assert outage.count == 1 and outage.down_since == 100.0
    assert not outage.probe_due(100.4) and outage.probe_due(100.5)
    waits, now = [], 100.5
    for _ in range(4):
        assert outage.probed(healthy=False, now=now) is None
        waits.append(round(outage.next_probe - now, 3))
        now = outage.next_probe
    assert waits == [1.0, 2.0, 2.0, 2.0]
    assert outage.probed(healthy=True, now=now) == now - 100.0
    assert outage.down_since is None and not outage.probe_due(now + 10)


def test_a_new_outage_starts_from_the_first_backoff_again():
    outage = Outage((0.5, 8.0))
    outage.began(0.0)
    outage.probed(healthy=False, now=0.5)
    outage.probed(healthy=True, now=1.5)
    assert outage.began(10.0) and outage.count == 2 and outage.next_probe == 10.5
