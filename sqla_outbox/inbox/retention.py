"""Retention: deleting the inbox's old keys, and what that costs.

A key stays as long as a duplicate of its message can still arrive: a duplicate whose key was
purged is processed again. So the retention sets the **deduplication window**: keep keys longer
than the longest a broker may redeliver (a consumer's visibility timeout or ack deadline times
its redeliveries, a replay from a stream's retention) plus the longest a relay may publish a
message again (its claim lease, after a relay died between publishing and marking).

:func:`purge` deletes keys received longer ago than ``older_than``, in batches of their own
short transactions (oldest first, through ``ix_outbox_inbox_received``), so consumers carry on
meanwhile. "Ago" is by the clock that rules the database (:mod:`sqla_outbox.clock`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from sqlalchemy import Engine, delete, select, tuple_
from sqlalchemy.engine import URL

from sqla_outbox.clock import database_now
from sqla_outbox.inbox.model import inbox_table
from sqla_outbox.preflight import operator_engine
from sqla_outbox.retention import PURGE_BATCH_SIZE, resolve_older_than, resolve_purge_batch_size

__all__ = ["purge"]


def purge(
    bind: Engine | str | URL,
    *,
    older_than: dt.timedelta,
    batch_size: int = PURGE_BATCH_SIZE,
    on_batch: Callable[[int], object] | None = None,
) -> int:
    """Delete the keys received more than ``older_than`` ago; return how many (module docs).

    :param bind: an ``Engine`` or a database URL.
    :param older_than: a positive ``timedelta``: the deduplication window.
    :param batch_size: keys per transaction.
    :param on_batch: called with the keys each committed batch deleted (progress).
    """
    older_than = resolve_older_than(older_than)
    batch_size = resolve_purge_batch_size(batch_size)
    table = inbox_table
    oldest = select(table.c.consumer, table.c.key).order_by(table.c.received_at).limit(batch_size)
    deleted = 0
    with operator_engine(bind) as engine:
        with engine.connect() as conn:
            cutoff = database_now(conn) - older_than
        while True:
            with engine.begin() as conn:
                batch = conn.execute(oldest.where(table.c.received_at < cutoff)).all()
                if batch:
                    pairs = [tuple(row) for row in batch]
                    gone = delete(table).where(tuple_(table.c.consumer, table.c.key).in_(pairs))
                    removed = conn.execute(gone).rowcount
                    deleted += removed
            if batch and on_batch is not None:
                on_batch(removed)
            if len(batch) < batch_size:
                return deleted
