"""Engines the outbox can trust with its transactions.

PostgreSQL needs nothing special. SQLite through Python's ``sqlite3`` (pysqlite) does: before
Python 3.12 the driver issues ``BEGIN`` lazily, only before DML, and commits on its own around
DDL, so a ``SAVEPOINT`` is silently not inside the transaction SQLAlchemy thinks it opened and a
rolled-back savepoint can keep its rows. :func:`create_engine` applies SQLAlchemy's documented
recipe (driver autocommit off, ``BEGIN`` emitted by SQLAlchemy), which makes transactions and
savepoints on SQLite behave as they do on PostgreSQL.

Relays need one more thing on SQLite: a claim must hold the database write lock from its first
statement, so two relays on one file can never both read the same unclaimed row. ``immediate=True``
makes every transaction ``BEGIN IMMEDIATE``, and on PostgreSQL ``utc=True`` runs every session
in UTC (see :func:`use_utc_sessions`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

__all__ = ["create_engine", "fix_sqlite_transactions", "hide_password", "use_utc_sessions"]


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


def use_utc_sessions(engine: Engine) -> Engine:
    """Run every new PostgreSQL session of ``engine`` in UTC; a no-op for other dialects.

    Why: psycopg gives ``timestamptz`` values the session's zone, and only a session whose
    ``TimeZone`` is literally ``UTC`` yields ``timezone.utc`` itself, the zone of every
    timestamp the outbox hands out. The relay's held connection is put in UTC by the relay
    itself, on any engine (``sqla_outbox.stores.postgresql``); this does it for every session,
    so the console script's other commands see UTC too. Only for engines whose connections the
    outbox owns (the console script's, or a relay given a URL): on an application's engine it
    would change what every other query sees.
    """
    if engine.dialect.name != "postgresql":
        return engine

    @event.listens_for(engine, "connect", insert=True)
    def _utc_session(dbapi_connection: Any, _record: Any) -> None:
        # SQLAlchemy's recipe for per-connection session settings: outside any transaction.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SET TIME ZONE 'UTC'")
        finally:
            cursor.close()
            dbapi_connection.autocommit = autocommit

    return engine


def create_engine(
    url: str | URL, *, immediate: bool = False, utc: bool = False, **kwargs: Any
) -> Engine:
    """``sqlalchemy.create_engine`` with SQLite's transaction handling fixed (see module doc),
    and with ``utc=True`` every PostgreSQL session in UTC (:func:`use_utc_sessions`)."""
    engine = fix_sqlite_transactions(sa.create_engine(url, **kwargs), immediate=immediate)
    return use_utc_sessions(engine) if utc else engine


def hide_password(url: str | URL) -> str:
    """The URL as text with any password replaced by ``***``, for logs and error messages.

    Also hides a ``password=`` query parameter, and the whole password when it holds an ``@``
    that was not written ``%40``: SQLAlchemy ends the password at the first ``@`` and takes the
    rest for the host, so rendering its parse would show the tail of the password as a host. A
    string SQLAlchemy cannot parse (a port that is not a number) is masked from the user name's
    ``:`` to its last ``@``; one that does not even look like ``scheme://...`` is shown only if it
    has no ``@`` at all.
    """
    try:
        parsed = sa.make_url(url)
    except Exception:  # not a URL SQLAlchemy can parse: mask it as text
        return _mask_text(str(url))
    if parsed.host and "@" in parsed.host:
        parsed = parsed.set(host=parsed.host.rpartition("@")[2])
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": _HIDDEN})
    return parsed.render_as_string(hide_password=True).replace(_HIDDEN_QUOTED, "***")


_HIDDEN = "***"
_HIDDEN_QUOTED = "%2A%2A%2A"  # how SQLAlchemy writes ``***`` in a query string


def _mask_text(text: str) -> str:
    # The user information ends at the *last* ``@``, so an ``@`` inside the password is masked
    # with the rest of it (an ``@`` in the query string only makes the mask wider).
    scheme, separator, rest = text.partition("://")
    if separator and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        return f"{scheme}://{user}{':' + _HIDDEN if colon else ''}@{host}"
    if separator or "@" not in text:
        return text
    return "<unparseable database URL>"
