"""When a relay sweeps for parked rows (sqla_outbox.sweeping): at its first idle moment, then
every SWEEP_INTERVAL whether idle or busy."""

from __future__ import annotations

from support import ManualClock

from sqla_outbox.sweeping import SWEEP_INTERVAL, SweepClock


def test_an_idle_relay_sweeps_at_once_then_every_interval() -> None:
    clock = ManualClock()
    sweeps = SweepClock(clock)
    assert sweeps.idle_due()  # never swept: a relay's first idle moment sweeps
    sweeps.swept()
    clock.now += SWEEP_INTERVAL * 0.9
    assert not sweeps.idle_due()
    clock.now += SWEEP_INTERVAL * 0.2
    assert sweeps.idle_due()


def test_a_busy_relay_sweeps_once_busy_for_an_interval_since_it_began_or_last_swept() -> None:
    clock = ManualClock()
    sweeps = SweepClock(clock)
    assert not sweeps.busy_due()  # busy from now on: not at its first pass
    clock.now += SWEEP_INTERVAL * 0.9
    assert not sweeps.busy_due()
    clock.now += SWEEP_INTERVAL * 0.2
    assert sweeps.busy_due()
    sweeps.swept()
    clock.now += SWEEP_INTERVAL * 0.9
    assert not sweeps.busy_due()
    clock.now += SWEEP_INTERVAL * 0.2
    assert sweeps.busy_due()


def test_going_idle_ends_the_busy_stretch() -> None:
    clock = ManualClock()
    sweeps = SweepClock(clock)
    sweeps.swept()
    sweeps.busy_due()
    clock.now += SWEEP_INTERVAL * 2
    sweeps.idle()  # idle a long while, with nothing parked: no sweep
    assert not sweeps.busy_due()  # a new stretch starts here, not where the old one did
    clock.now += SWEEP_INTERVAL * 1.1
    assert sweeps.busy_due()
