"""When a relay sweeps for parked rows that nothing holds back any more.

Parking keeps claims bounded: a claim parks the rows a stuck row (a dead letter, a row in its
backoff) holds back, and the statement that publishes the holder unparks them. A row parked at
the very moment its holder is published, by a statement that did not yet see it parked, is
unparked by nothing but the sweep (:func:`sqla_outbox.queries.free_parked_stmt`), so every
relay sweeps every :data:`SWEEP_INTERVAL` seconds:

* while idle, from the idle loop, when parked rows exist or the next row to come due is far
  enough ahead to be parked (a drain also sweeps when it finds nothing to claim);
* while busy, between passes. A relay whose backlog never empties never goes idle: sweeping
  only then would leave such a row waiting for the first quiet moment, which under steady load
  may never come.

The same sweep parks the rows not due for a while and wakes them before they are due
(:mod:`sqla_outbox.waiting`): three statements in one transaction, each reading a few index
entries per row it looks at, so a busy relay pays them once every few seconds, not once a pass.
Each reads a bounded number of rows: the head of the claim's index, the rows due to wake, and a
window of the parked rows that moves on from sweep to sweep (:class:`ParkedCursor`).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["SWEEP_INTERVAL", "ParkedCursor", "SweepClock", "Swept"]

SWEEP_INTERVAL = 5.0
"""Seconds between a relay's sweeps for parked rows, idle or busy."""


class Swept(NamedTuple):
    """What one sweep changed: rows ``unparked`` (nothing stuck holds them back any more),
    ``woken`` (parked until due, and due soon) and ``parked`` until due
    (:mod:`sqla_outbox.waiting`)."""

    unparked: int
    woken: int
    parked: int

    @property
    def freed(self) -> int:
        """Rows back in the claim's index: a claim may find work it could not before."""
        return self.unparked + self.woken


class SweepClock:
    """Says when a relay is due to sweep: :data:`SWEEP_INTERVAL` after it last swept, or after
    it started; idle or busy, the same rule, with one exception. A relay that finds nothing to
    claim before it has ever swept sweeps at once: after a time with no relay running, what
    holds it up may be rows parked until due that came due meanwhile, or rows parked behind a
    holder published without unparking them, and they should not wait an interval. A relay
    busy with a backlog keeps the interval (a drain would otherwise pay a sweep at its first
    pass, for rows that go out within the interval anyway).

    Unlocked: the relay's loop (or a drain) asks it between passes. Two callers racing can at
    worst make one sweep early or late, never skip sweeping for good.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self._ever = False

    def swept(self) -> None:
        """A sweep has just run (whatever it found)."""
        self._last = self._clock()
        self._ever = True

    def due(self, *, idle: bool = False) -> bool:
        """Whether :data:`SWEEP_INTERVAL` has passed since the last sweep (or the start), or,
        for a relay that found nothing to claim (``idle``), whether it has never swept."""
        return (idle and not self._ever) or self._clock() - self._last >= SWEEP_INTERVAL


class ParkedCursor:
    """Where a relay's next sweep starts reading the parked rows
    (:func:`sqla_outbox.queries.parked_window`): just after the last row the previous sweep
    read, or at the first parked row once a sweep read fewer rows than its window holds.

    A sweep reads a bounded window of the parked rows, rows parked until due included, so its
    cost does not grow with them; the window moves on sweep by sweep and comes round again, so
    a row parked behind a holder that is gone is reached within ``parked / window`` sweeps.
    Each relay keeps its own cursor: two relays' windows may overlap or not, either is safe
    (unparking is idempotent, and a claim decides what a free row may overtake).
    """

    FIRST: tuple[dt.datetime, uuid.UUID] = (
        dt.datetime(1000, 1, 1, tzinfo=dt.timezone.utc),
        uuid.UUID(int=0),
    )
    """Before every row: the earliest instant MySQL's ``DATETIME`` holds, and the nil UUID."""

    def __init__(self) -> None:
        self._after = self.FIRST

    def params(self) -> dict[str, Any]:
        """The window's parameters: ``after_staged_at`` and ``after_id``."""
        staged_at, row_id = self._after
        return {"after_staged_at": staged_at, "after_id": row_id}

    def advance(
        self, last_staged_at: dt.datetime | None, last_id: uuid.UUID | None, read: int, limit: int
    ) -> None:
        """Move past a sweep's window, which read ``read`` rows of at most ``limit`` and ended
        at ``(last_staged_at, last_id)``; back to the first parked row when it was short."""
        if read < limit or last_staged_at is None or last_id is None:
            self._after = self.FIRST
        else:
            self._after = (last_staged_at, last_id)
