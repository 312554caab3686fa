"""Engines the outbox can trust with its transactions.

PostgreSQL needs nothing special. SQLite through Python's ``sqlite3`` (pysqlite) does: before
Python 3.12 the driver issues ``BEGIN`` lazily, only before DML, and commits on its own around
DDL, so a ``SAVEPOINT`` is silently not inside the transaction SQLAlchemy thinks it opened and a
rolled-back savepoint can keep its rows. :func:`create_engine` applies SQLAlchemy's documented
recipe (driver autocommit off, ``BEGIN`` emitted by SQLAlchemy), which makes transactions and
savepoints on SQLite behave as they do on PostgreSQL.

Relays need one more thing on SQLite: a claim must hold the database write lock from its first
statement, so two relays on one file can never both read the same unclaimed row. ``immediate=True``
makes every transaction ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

__all__ = ["create_engine", "fix_sqlite_transactions", "hide_password"]


def fix_sqlite_transactions(engine: Engine, *, immediate: bool = False) -> Engine:
    """Make pysqlite's transactions real on ``engine``; a no-op for other dialects.

    Call it on an SQLite engine you built yourself; :func:`create_engine` calls it for you.
    """
    if engine.dialect.name != "sqlite" or engine.dialect.driver != "pysqlite":
        return engine
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        # Stop pysqlite from emitting BEGIN/COMMIT on its own; SQLAlchemy does it below.
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)

    return engine


def create_engine(url: str | URL, *, immediate: bool = False, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` with SQLite's transaction handling fixed (see module doc)."""
    engine = sa.create_engine(url, **kwargs)
    return fix_sqlite_transactions(engine, immediate=immediate)


def hide_password(url: str | URL) -> str:
    """The URL as text with any password replaced by ``***``, for logs and error messages."""
    try:
        parsed = sa.make_url(url)
    except Exception:  # not a URL at all: show it only if it carries no credentials
        text = str(url)
        return text if "@" not in text else "<unparseable database URL>"
    return parsed.render_as_string(hide_password=True)
