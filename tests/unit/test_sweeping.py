"""When a relay sweeps for parked rows (sqla_outbox.sweeping): every SWEEP_INTERVAL after it
started or last swept, whether idle or busy; and at once when it first finds nothing to claim."""

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


def test_a_relay_that_first_finds_nothing_to_claim_sweeps_at_once() -> None:
    """Idle before it ever swept (rows may have come due parked, or been left parked, while no
    relay ran): due at once; once it has swept, idle or not, the interval again."""
    clock = ManualClock()
    sweeps = SweepClock(clock)
    assert sweeps.due(idle=True)
    assert not sweeps.due()
    sweeps.swept()
    assert not sweeps.due(idle=True)
    clock.now += SWEEP_INTERVAL
    assert sweeps.due(idle=True) and sweeps.due()
