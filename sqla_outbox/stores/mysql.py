"""MySQL 8.0+ and MariaDB 10.6+: a claim is lock and read, guard, stamp, commit.

Both have ``SELECT ... FOR UPDATE SKIP LOCKED`` but no ``UPDATE ... RETURNING`` (nor partial
indexes or LISTEN), so the claim is a short transaction of statements rather than one:

1. the previous pass's write-back, if it rides on this claim (fenced, as everywhere);
2. :func:`~sqla_outbox.queries.lock_stmt`: lock up to a window of claimable rows in claim order
   and read them (``SKIP LOCKED``: concurrent relays lock disjoint rows and never wait);
3. :func:`~sqla_outbox.queries.plan_stmt`: the ordering guard over the locked rows, the same as
   PostgreSQL's (a locked row whose transaction or key has an unpublished row before it that is
   not locked here is left, and parked when that row is stuck);
4. park and stamp the rows by primary key; COMMIT releases the locks.

A mark unparking what it freed, a sweep unparking the rows nothing holds back any more and one
parking rows not due yet (:mod:`sqla_outbox.waiting`) read those rows with a plain read first
and change them by primary key, for the same reason: locks only on the rows they change (a
derived table in the UPDATE was read with shared locks, on which two relays deadlocked).

Why it keeps the promises: the locks taken in step 2 last until the commit, so no other relay
can take or stamp those rows meanwhile; a row another relay has locked but not stamped yet is
unpublished and not ours, so the guard counts it as a holder, exactly like a stamped one. The
transaction runs at ``READ COMMITTED``: every statement sees what other relays committed
before it, rather than a snapshot as old as the transaction's first read.

Timestamps are computed by the relay in UTC (``now``), as on SQLite: the table's
``DATETIME(6)`` columns hold UTC without a zone, whatever the server's ``time_zone``. Relays
poll (no LISTEN); a commit in the relay's own process still wakes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Executable

from sqla_outbox import queries
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.stores.base import SqlStore

__all__ = ["MySQLStore"]


class MySQLStore(SqlStore):
    """The relay's statements on MySQL 8.0+ and MariaDB 10.6+."""

    def __init__(self, engine: Engine, **settings: Any) -> None:
        super().__init__(engine, **settings)
        dialect, order = self._dialect, self._order
        self._lock = queries.lock_stmt(dialect, order)
        self._plan = queries.plan_stmt(dialect, order)
        self._stamp = queries.stamp_stmt(dialect)
        self._park_rows = queries.park_rows_stmt(dialect)
        self._waiting_head = queries.waiting_head_stmt(dialect)
        self._parked_behind = queries.parked_behind_stmt(dialect)
        self._unpark_rows = queries.unpark_rows_stmt(dialect)
        self._sweep = queries.free_parked_stmt(dialect)  # read; unparked by _unpark_free

    def _claim_once(self, token: str, carried: WriteBack | None, params: dict[str, Any]) -> Claimed:
        now = params["now"]
        with self._transaction(statements=4) as conn:
            if carried is not None:
                self._write_in_steps(conn, carried)
            rows = self._rows(conn.execute(self._lock, params))
            leave: dict[Any, bool] = {}
            if rows:
                candidates = {"candidate_ids": [row[0] for row in rows], "now": now}
                leave = {row[0]: row[1] for row in conn.execute(self._plan, candidates)}
            taken = [row for row in rows if row[0] not in leave][: self._batch_size]
            park = [row_id for row_id, parks in leave.items() if parks]
            if park:
                conn.execute(self._park_rows, {"ids": park})
            if taken:
                stamp = {"ids": [row[0] for row in taken], "token": token, "now": now}
                conn.execute(self._stamp, stamp)
        claimed = self._decode(token, taken, 0)
        claimed.parked = len(park)
        claimed.held = len(leave)
        return claimed

    def _unpark_behind(self, conn: Connection, ids: list[uuid.UUID]) -> None:
        """Unpark what ``ids`` held back: read, then changed by primary key (see
        :func:`~sqla_outbox.queries.parked_behind_stmt`)."""
        _read_then_change(conn, self._parked_behind, self._unpark_rows, {"ids": ids})

    def _unpark_free(self, conn: Connection, params: dict[str, Any]) -> int:
        """Unpark the free rows of the sweep's window: read, then changed by primary key (see
        :func:`~sqla_outbox.queries.sweep_parked_stmt`)."""
        return _read_then_change(conn, self._sweep, self._unpark_rows, params)

    def _park_waiting_rows(self, conn: Connection, params: dict[str, Any]) -> int:
        """Park the rows not due for a while: read, then changed by primary key (see
        :func:`~sqla_outbox.queries.waiting_head_stmt`)."""
        return _read_then_change(conn, self._waiting_head, self._park_waiting, params)

    @contextmanager
    def _transaction(self, statements: int) -> Iterator[Connection]:
        """A transaction on the connection held across passes, at ``READ COMMITTED``.

        Set once per connection: an engine's ``isolation_level`` would set it and reset it at
        every checkout, four more round trips a pass.
        """
        with self._held_step(begin=True) as conn:
            yield conn

    def _open_held(self) -> Connection:
        # SQLAlchemy sets the level on this checkout and restores it when the connection goes
        # back to the pool.
        return self.engine.connect().execution_options(isolation_level="READ COMMITTED")


def _read_then_change(
    conn: Connection, read: Executable, change: Executable, params: dict[str, Any]
) -> int:
    """Run ``read`` (a plain read of ids: no locks), then ``change`` on those ids (``:ids``,
    locked by primary key as it changes them); how many rows it changed. A derived table in
    the UPDATE would read the same rows with shared locks (see the module docs)."""
    ids = list(conn.scalars(read, params))
    if not ids:
        return 0
    return conn.execute(change, {**params, "ids": ids}).rowcount
