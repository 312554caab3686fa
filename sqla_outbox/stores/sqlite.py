"""SQLite: a claim is a transaction under the database-wide write lock.

SQLite has no row locks. The relay's engine opens every transaction with ``BEGIN IMMEDIATE``
(:func:`~sqla_outbox.engines.fix_sqlite_transactions`), so a claim holds the write lock from its
first statement: the previous pass's write-back, the windows it reads, and the stamping and
parking by id run in one transaction that no other relay can interleave with, and each
statement sees the ones before it. That is the base store's claim as it is; this store adds
nothing to it.
"""

from __future__ import annotations

from sqla_outbox.stores.base import SqlStore

__all__ = ["SQLiteStore"]


class SQLiteStore(SqlStore):
    """The relay's statements on SQLite (3.35+, for ``RETURNING``)."""
