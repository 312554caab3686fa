"""When a PostgreSQL relay analyses the outbox itself (sqla_outbox.analyzing): once its claims
and sweeps moved ANALYZE_ROWS rows between the partial indexes, at most every
ANALYZE_INTERVAL seconds, the first time at once."""

from __future__ import annotations

from support import ManualClock

from sqla_outbox.analyzing import ANALYZE_INTERVAL, ANALYZE_ROWS, StaleStatistics


def test_the_table_is_analysed_once_rows_moved_in_thousands_at_most_every_interval() -> None:
    clock = ManualClock()
    stale = StaleStatistics(clock)
    stale.moved(ANALYZE_ROWS - 1)
    assert not stale.due()  # a few rows: autovacuum's business
    stale.moved(1)
    assert stale.due()  # the first time, at once
    assert stale.analysed() == ANALYZE_ROWS
    stale.moved(5 * ANALYZE_ROWS)
    assert not stale.due()  # not twice within the interval
    clock.now += ANALYZE_INTERVAL
    assert stale.due()
    stale.analysed()
    clock.now += ANALYZE_INTERVAL
    assert not stale.due()  # nothing moved since
