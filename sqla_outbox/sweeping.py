"""When a relay sweeps for parked rows that nothing holds back any more.

Parking keeps claims bounded: a claim parks the rows a stuck row (a dead letter, a row in its
backoff) holds back, and the statement that publishes the holder unparks them. A row parked at
the very moment its holder is published, by a statement that did not yet see it parked, is
unparked by nothing but the sweep (:func:`sqla_outbox.queries.sweep_parked_stmt`), so every
relay sweeps every :data:`SWEEP_INTERVAL` seconds:

* while idle, from the idle loop, when parked rows exist (a drain also sweeps when it finds
  nothing to claim);
* while busy, between passes, once it has worked for a whole interval without a sweep. A relay
  whose backlog never empties never goes idle: sweeping only then left such a row waiting for
  the first quiet moment, which under steady load may never come.

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
    """Says when a relay is due to sweep; the relay tells it when it swept.

    Unlocked: the relay's loop (or a drain) asks it between passes. Two callers racing can at
    worst make one sweep early or late, never skip sweeping for good.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = float("-inf")  # never: the first idle moment sweeps
        self._busy_since: float | None = None

    def swept(self) -> None:
        """A sweep has just run (whatever it found)."""
        self._last = self._clock()

    def idle(self) -> None:
        """The relay found nothing to claim: its busy stretch, if any, is over."""
        self._busy_since = None

    def idle_due(self) -> bool:
        """Whether an idle relay should sweep now."""
        return self._clock() - self._last >= SWEEP_INTERVAL

    def busy_due(self) -> bool:
        """Whether a relay between two passes that claimed should sweep now: once it has been
        busy for :data:`SWEEP_INTERVAL` since it started being busy or last swept."""
        now = self._clock()
        if self._busy_since is None:
            self._busy_since = now
        return now - max(self._last, self._busy_since) >= SWEEP_INTERVAL
