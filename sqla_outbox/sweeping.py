"""When a relay sweeps for parked rows that nothing holds back any more.

Parking keeps claims bounded: a claim parks the rows a stuck row (a dead letter, a row in its
backoff) holds back, and the statement that publishes the holder unparks them. A row parked at
the very moment its holder is published, by a statement that did not yet see it parked, is
unparked by nothing but the sweep (:func:`sqla_outbox.queries.sweep_parked_stmt`), so every
relay sweeps every :data:`SWEEP_INTERVAL` seconds:

* while idle, from the idle loop, when parked rows exist (a drain also sweeps when it finds
  nothing to claim);
* while busy, between passes. A relay whose backlog never empties never goes idle: sweeping
  only then left such a row waiting for the first quiet moment, which under steady load may
  never come.

A sweep is one statement that reads a few index entries per parked row, so a busy relay pays it
once every few seconds, not once a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SWEEP_INTERVAL", "SweepClock"]

SWEEP_INTERVAL = 5.0
"""Seconds between a relay's sweeps for parked rows, idle or busy."""


class SweepClock:
    """Says when a relay is due to sweep: :data:`SWEEP_INTERVAL` after it last swept, or after
    it started. Idle or busy, the same rule; a relay started with rows left parked frees them
    within one interval.

    Unlocked: the relay's loop (or a drain) asks it between passes. Two callers racing can at
    worst make one sweep early or late, never skip sweeping for good.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def swept(self) -> None:
        """A sweep has just run (whatever it found)."""
        self._last = self._clock()

    def due(self) -> bool:
        """Whether :data:`SWEEP_INTERVAL` has passed since the last sweep (or the start)."""
        return self._clock() - self._last >= SWEEP_INTERVAL
