"""When a row that is not due yet leaves the claim's index, and when it comes back.

Every claim reads ``ix_outbox_claimable`` from its oldest row and steps over the rows there that
are not due yet: a message scheduled for later (``run_at``) and a failed one waiting out its retry
backoff (``retry_at``). Each costs a claim a visit to the table on every pass, and thousands of
them ahead of the due rows (a day's scheduled reminders, or a queue whose every message a broker
refuses, once each has failed) cost every claim thousands of visits. So a relay's sweep
(:mod:`sqla_outbox.sweeping`, every few seconds, busy or idle) also

* **parks** the rows among the first :data:`HEAD_ROWS` of the claim index that come due more
  than :data:`PARK_AHEAD` from now, recording when in ``wake_at`` (table version 4): parked, a
  row is out of the claim's index, as a row held back behind a dead letter is;
* **wakes** the rows parked that way that come due within :data:`WAKE_AHEAD` (clears ``parked``
  and ``wake_at``), wherever they are, through ``ix_outbox_waking``.

A woken row is back in the claim's index at least ``WAKE_AHEAD - SWEEP_INTERVAL`` before it is
due, and the claim's own test of ``run_at`` and ``retry_at`` takes it on time: nothing waits for
a sweep. Only while no relay runs can a row come due parked; the next relay to start wakes it,
at once if it finds nothing else to claim (:class:`~sqla_outbox.sweeping.SweepClock`).

A parked row keeps its meaning: a scheduled row holds nothing back before it is due, and a row
in its backoff holds its transaction's and key's later rows (parked rows are stuck holders to
the claim). Only the sweep unparks a row with a ``wake_at``: a holder's mark and the sweep for
held-back rows leave it alone.

Why the thresholds: a row is parked only when it is due later than it would be woken
(``PARK_AHEAD > WAKE_AHEAD``), so the sweep that wakes a row never parks it again; the rows due
between the two stay in the index, a minute's worth at most. Sweeps examine only the head of
the index, where the claims read: a row not due behind thousands of due rows costs no claim
until they are published, and a later sweep parks it then.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["HEAD_ROWS", "PARK_AHEAD", "WAKE_AHEAD"]

PARK_AHEAD = dt.timedelta(seconds=60)
"""A row due later than this from now, among the :data:`HEAD_ROWS`, is parked until it is due."""

WAKE_AHEAD = dt.timedelta(seconds=20)
"""A row parked until due is woken this long before it is (four sweep intervals: a late sweep
still wakes it in time)."""

HEAD_ROWS = 10_000
"""How many rows of the claim index, oldest first, one sweep examines for rows to park: a few
milliseconds every sweep while a backlog is due, and a whole day's scheduled rows parked by one
sweep."""
