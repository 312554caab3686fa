"""The trimming policy: claims end on transaction boundaries only for a while after a crowded
claim (sqla_outbox.trimming)."""

from __future__ import annotations

from sqla_outbox.trimming import TRIM_FOR, Trimming


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_claims_trim_for_a_while_after_each_crowded_claim() -> None:
    clock = Clock()
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
