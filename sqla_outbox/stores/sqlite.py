"""SQLite: a claim is a transaction under the database-wide write lock.

SQLite has no row locks and allows no UPDATE inside WITH. The relay's engine opens every
transaction with ``BEGIN IMMEDIATE`` (:func:`~sqla_outbox.engines.fix_sqlite_transactions`), so
a claim holds the write lock from its first statement: the previous pass's write-back, the
parking (:func:`~sqla_outbox.queries.park_stmt`) and the claim's ``UPDATE ... RETURNING`` run
in one transaction that no other relay can interleave with, and each statement sees the ones
before it. ``RETURNING`` gives no order, so the claimed rows are sorted here.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from sqla_outbox import queries
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.stores.base import SqlStore

__all__ = ["SQLiteStore"]


class SQLiteStore(SqlStore):
    """The relay's statements on SQLite (3.35+, for ``RETURNING``)."""

    def __init__(self, engine: Engine, **settings: Any) -> None:
        super().__init__(engine, **settings)
        self._park = queries.park_stmt("sqlite", self._order)
        self._claim = queries.claim_stmt("sqlite", self._order)

    def _claim_once(self, token: str, carried: WriteBack | None, params: dict[str, Any]) -> Claimed:
        with self._transaction(statements=2) as conn:
            if carried is not None:
                self._write_in_steps(conn, carried)
            parked = len(conn.execute(self._park, params).all())
            rows = self._rows(conn.execute(self._claim, params))
        claimed = self._decode(token, rows, 0)
        # UUID.int compares natively; UUID objects compare through Python-level methods.
        order = sorted(
            range(len(claimed.messages)),
            key=lambda i: (claimed.messages[i].staged_at, claimed.messages[i].id.int),
        )
        claimed.messages = [claimed.messages[i] for i in order]
        claimed.attempts = [claimed.attempts[i] for i in order]
        claimed.parked = parked
        return claimed
