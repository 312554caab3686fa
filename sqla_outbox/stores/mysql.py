"""MySQL 8.0+ and MariaDB 10.6+: the base store's claim, at ``READ COMMITTED``.

Both have ``SELECT ... FOR UPDATE SKIP LOCKED`` but no ``UPDATE ... RETURNING`` (nor partial
indexes or LISTEN): the claim is the base store's transaction of statements (lock a window
with its predecessors, read the holders, stamp and park by id), whose locks last until its
COMMIT, so no other relay can take or stamp those rows meanwhile; a row another relay has locked
but not stamped yet is skipped, so it is a predecessor that is not a candidate, and what waits
for it is left. The transaction runs at ``READ COMMITTED``: every statement sees what other
relays committed before it, rather than a snapshot as old as the transaction's first read.

A sweep unparking the rows nothing holds back any more and one parking rows not due yet
(:mod:`sqla_outbox.waiting`) read those rows with a plain read first and change them by primary
key: MySQL refuses a subquery on the table an UPDATE changes, and a derived table there is read
with shared locks, on which two relays' sweeps and marks deadlock.

Timestamps are computed by the relay in UTC (``now``), as on SQLite: the table's
``DATETIME(6)`` columns hold UTC without a zone, whatever the server's ``time_zone``. Relays
poll (no LISTEN); a commit in the relay's own process still wakes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Executable

from sqla_outbox import queries
from sqla_outbox.stores.base import SqlStore

__all__ = ["MySQLStore"]


class MySQLStore(SqlStore):
    """The relay's statements on MySQL 8.0+ and MariaDB 10.6+."""

    def __init__(self, engine: Engine, **settings: Any) -> None:
        super().__init__(engine, **settings)
        dialect = self._dialect
        self._links = queries.links_stmt(dialect)
        self._waiting_head = queries.waiting_head_stmt(dialect)
        self._sweep = queries.free_parked_stmt(dialect)  # read; unparked by _unpark_free

    def _read_window(self, conn: Connection, params: dict[str, Any]) -> Sequence[Any]:
        """Lock the window, then read its rows' links without locks (see
        :func:`~sqla_outbox.queries.window_stmt`)."""
        rows = self._rows(conn.execute(self._window, params))
        if not rows:
            return rows
        found = conn.execute(self._links, {**params, "ids": [row[0] for row in rows]})
        links = {row[0]: tuple(row[1:]) for row in found}
        return [(*row, *links[row[0]]) for row in rows]

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
