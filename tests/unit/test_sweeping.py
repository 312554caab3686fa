"""When a relay sweeps for parked rows (sqla_outbox.sweeping): every SWEEP_INTERVAL after it
started or last swept, whether idle or busy."""

from __future__ import annotations

from support import ManualClock

from sqla_outbox.sweeping import SWEEP_INTERVAL, SweepClock


def test_a_relay_sweeps_an_interval_after_it_starts_then_after_each_sweep() -> None:
    clock = ManualClock()
    sweeps = SweepClock(clock)
    assert not sweeps.due()  # not at the first pass of a drain
    clock.now += SWEEP_INTERVAL * 0.9
    assert not sweeps.due()
    clock.now += SWEEP_INTERVAL * 0.2
    assert sweeps.due()
    assert sweeps.due()  # until it has swept
    sweeps.swept()
    clock.now += SWEEP_INTERVAL * 0.9
    assert not sweeps.due()
    clock.now += SWEEP_INTERVAL * 0.2
    assert sweeps.due()
