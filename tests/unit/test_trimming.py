"""The trimming policy: claims end on transaction boundaries only for a while after a crowded
claim (sqla_outbox.trimming)."""

from __future__ import annotations

from support import ManualClock

from sqla_outbox.trimming import TRIM_FOR, Trimming


def test_claims_trim_for_a_while_after_each_crowded_claim() -> None:
    clock = ManualClock()
    trimming = Trimming(clock)
    assert not trimming.on  # a relay alone: full batches
    trimming.crowded()
    assert trimming.on
    clock.now += TRIM_FOR / 2
    trimming.crowded()  # another crowded claim: the while starts again
    clock.now += TRIM_FOR * 0.9
    assert trimming.on
    clock.now += TRIM_FOR * 0.2
    assert not trimming.on
