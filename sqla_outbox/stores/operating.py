"""The operators' side of the store seam: status, the metrics backlog, dead letters, purge.

Each method runs on a connection the caller holds (its transaction, its privilege check) and
hides what differs between databases: whose clock measures ages (:mod:`sqla_outbox.clock`),
and on MySQL and MariaDB, whose UPDATE cannot return the rows it changed, reading the dead
letters' ids locked before changing exactly those. Nothing outside :mod:`sqla_outbox.stores`
branches on a dialect to read or change the outbox.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Row

from sqla_outbox import clock, queries
from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.notify import CHANNEL

__all__ = [
    "MySQLOperations",
    "Operations",
    "PostgreSQLOperations",
    "StatusRows",
    "operations_for",
]

StatusRows = tuple[dt.datetime, Any, Sequence[Any], Sequence[Any]]
"""What :meth:`Operations.status` reads: the time it was read at (the database's clock on
PostgreSQL), the counts, the claims and the rows holding others back."""


class Operations:
    """The operators' statements on one database (PostgreSQL and SQLite as they are)."""

    purge_isolation: str | None = None
    """The isolation level a purge batch runs at, when not the engine's."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect

    def pending(self, conn: Connection) -> int:
        """Committed rows not yet published (dead letters included)."""
        return int(conn.execute(queries.pending_stmt()).scalar_one())

    def backlog(self, conn: Connection) -> tuple[int, int, float]:
        """``(pending, dead, seconds the longest-waiting due row has waited)``."""
        row = conn.execute(queries.backlog_stmt(self.dialect), clock.instants(self.dialect, {}))
        found = row.one()
        oldest = found.oldest_due_at
        age = 0.0 if oldest is None else max(0.0, (found.now - oldest).total_seconds())
        return int(found.pending), int(found.dead), age

    def status(self, conn: Connection, holding: int) -> StatusRows:
        """The backlog's counts, the claims holding rows, and the first ``holding`` failed rows
        that hold others back, all at one instant."""
        now = clock.database_now(conn)
        params = {} if clock.server_clock(self.dialect) else {"now": now}
        counts = conn.execute(queries.status_stmt(self.dialect), params).one()
        claims = conn.execute(queries.claims_stmt()).all()
        rows = conn.execute(queries.holding_stmt(), {"limit": holding}).all()
        return now, counts, claims, rows

    def dead_letters(self, conn: Connection) -> Sequence[Row[Any]]:
        """Every dead letter in claim order: the message's columns, then ``attempts``,
        ``last_error``, ``retry_at`` and ``dead_at``."""
        return conn.execute(queries.dead_letters_stmt(self.dialect)).all()

    def retry_dead(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        """Make the dead letters ``ids`` (``None``: all) claimable now; the ids retried."""
        statement = queries.retry_dead_stmt(self.dialect, ids=ids is not None)
        return list(conn.execute(statement, _ids(ids)).scalars())

    def discard_dead(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        """Delete the dead letters ``ids`` (``None``: all) after unparking the rows parked
        behind them; the ids deleted. (Unparking behind an id that is not a dead letter is
        harmless: a row that still has to wait is parked again by the next claim.)"""
        unpark = queries.unpark_behind_stmt(self.dialect, dead=ids is None)
        conn.execute(unpark, _ids(ids))
        statement = queries.delete_dead_stmt(self.dialect, ids=ids is not None)
        return list(conn.execute(statement, _ids(ids)).scalars())

    def purge_batch(self, conn: Connection, cutoff: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` rows published before ``cutoff``; how many."""
        statement = queries.purge_stmt(self.dialect)
        return int(conn.execute(statement, {"cutoff": cutoff, "limit": limit}).rowcount)

    def purge_engine(self, engine: Engine) -> Engine:
        """``engine`` as purge batches run on it (:attr:`purge_isolation`)."""
        if self.purge_isolation is None:
            return engine
        return engine.execution_options(isolation_level=self.purge_isolation)


class MySQLOperations(Operations):
    """MySQL 8.0+ and MariaDB 10.6+: no ``UPDATE ... RETURNING``, so the dead-letter
    operations read the ids locked first (:func:`~sqla_outbox.queries.dead_letters_stmt`
    with ``lock``) and change exactly those, in the caller's transaction; purges run at
    ``READ COMMITTED``, or InnoDB's next-key locks over the range read would make inserts of
    new rows wait for the batch."""

    purge_isolation = "READ COMMITTED"

    def _locked(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        statement = queries.dead_letters_stmt(self.dialect, ids=ids is not None, lock=True)
        return list(conn.execute(statement, _ids(ids)).scalars())

    def retry_dead(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        locked = self._locked(conn, ids)
        if locked:
            conn.execute(queries.retry_dead_stmt(self.dialect, ids=True), {"ids": locked})
        return locked

    def discard_dead(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        locked = self._locked(conn, ids)
        if locked:
            conn.execute(queries.unpark_behind_stmt(self.dialect), {"ids": locked})
            conn.execute(queries.delete_dead_stmt(self.dialect, ids=True), {"ids": locked})
        return locked


class PostgreSQLOperations(Operations):
    """PostgreSQL: retrying or discarding dead letters frees rows, which relays that ``LISTEN``
    would otherwise find only at their next poll (an idle one polls rarely, or not at all while
    its ``LISTEN`` is up). So the same transaction notifies the outbox's channel, as a commit of
    new rows does (:mod:`sqla_outbox.notify`): the notification is delivered if and when it
    commits, and every relay listening on the database claims at once."""

    def retry_dead(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        return _notified(conn, super().retry_dead(conn, ids))

    def discard_dead(self, conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
        return _notified(conn, super().discard_dead(conn, ids))


def _notified(conn: Connection, changed: list[uuid.UUID]) -> list[uuid.UUID]:
    """``changed``, after notifying the outbox's channel in ``conn``'s transaction if any row
    changed."""
    if changed:
        conn.execute(queries.notify_stmt(), {"channel": CHANNEL})
    return changed


def operations_for(dialect: str) -> Operations:
    """The operators' statements for ``dialect``."""
    if dialect in MYSQL_DIALECTS:
        return MySQLOperations(dialect)
    if dialect == "postgresql":
        return PostgreSQLOperations(dialect)
    return Operations(dialect)


def _ids(ids: Sequence[uuid.UUID] | None) -> dict[str, Any]:
    return {} if ids is None else {"ids": list(ids)}
