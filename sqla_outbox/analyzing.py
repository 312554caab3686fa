"""When a relay on PostgreSQL analyses the outbox table itself.

Parking moves rows out of ``ix_outbox_claimable`` (and waking, back in). The planner chooses
between the outbox's indexes of the same columns from the table's statistics: the claim's scan
between ``ix_outbox_claimable`` and ``ix_outbox_unpublished`` (both ``(staged_at, id)``; the
claim locks its rows, so the scan of either keeps the same filter and costs the same), and the
probe for a candidate's parked rows between ``ix_outbox_parked_group`` and
``ix_outbox_parked_key``. Until the statistics count the rows just parked, it may take the index
that still holds them, or one it must read whole, and read every parked row on every claim:
rows parked to spare the claims then cost each claim as much as if they had stayed, or more
(the benchmark workload ``not_due`` drains past such rows). Autovacuum analyses a table once a
tenth of its rows changed, within a minute, where it runs at all.

So a PostgreSQL relay counts the rows its claims parked and its sweeps parked, woke and
unparked, and once they reach :data:`ANALYZE_ROWS`, at most once per :data:`ANALYZE_INTERVAL`,
its sweep runs ``ANALYZE`` on the table (:func:`sqla_outbox.queries.analyze_stmt`). It samples
a few hundred pages whatever the table's size: tens of milliseconds, about once a minute at
most, and only while rows move in thousands. A role that does not own the table (or, from
PostgreSQL 16, hold ``MAINTAIN`` on it) gets a warning from the server, not an error: the relay
goes on and the statistics wait for autovacuum. Elsewhere there is nothing to do: MySQL's claim
names its index, and SQLite keeps no statistics unless asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ANALYZE_INTERVAL", "ANALYZE_ROWS", "StaleStatistics"]

ANALYZE_ROWS = 1_000
"""Rows moved between the outbox's partial indexes that make its statistics worth refreshing."""

ANALYZE_INTERVAL = 60.0
"""Seconds a relay lets pass between two ``ANALYZE`` of its own (autovacuum's naptime)."""


class StaleStatistics:
    """Counts the rows a relay moved in or out of the claim's index since it last analysed the
    table, and says when to analyse it again: :data:`ANALYZE_ROWS` of them, and
    :data:`ANALYZE_INTERVAL` since the last time (the first time, at once).

    Unlocked: only the relay's passes and sweeps, which it serialises, use it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._moved = 0
        self._last: float | None = None

    def moved(self, rows: int) -> None:
        """``rows`` more rows were parked, woken or unparked."""
        self._moved += rows

    def due(self) -> bool:
        """Whether to analyse the table now."""
        if self._moved < ANALYZE_ROWS:
            return False
        return self._last is None or self._clock() - self._last >= ANALYZE_INTERVAL

    def analysed(self) -> int:
        """The table has just been analysed; how many moved rows that accounted for."""
        moved, self._moved, self._last = self._moved, 0, self._clock()
        return moved
