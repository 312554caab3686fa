"""When a relay sweeps for parked rows (sqla_outbox.sweeping): at its first chance after it
starts, then every SWEEP_INTERVAL after it last swept, whether idle or busy."""

from __future__ import annotations

from support import ManualClock

from sqla_outbox.sweeping import SWEEP_INTERVAL, SweepClock


def test_a_relay_sweeps_at_its_first_chance_then_an_interval_after_each_sweep() -> None:
    """Due at once (rows may have come due, or been left parked, while no relay ran), until
    it has swept; then not before an interval has passed."""
    clock = ManualClock()
    sweeps = SweepClock(clock)
    assert sweeps.due()
    assert sweeps.due()  # until it has swept
    sweeps.swept()
    clock.now += SWEEP_INTERVAL * 0.9
    assert not sweeps.due()
    clock.now += SWEEP_INTERVAL * 0.2
    assert sweeps.due()
    sweeps.swept()
    assert not sweeps.due()
