"""Stores: where the relay's pass protocol meets one database.

A :class:`~sqla_outbox.Relay` keeps the loop and the pass protocol (claim, publish, write back)
and asks a store to run each step; only stores see SQL, dialects and drivers. Each store runs
the statements of :mod:`sqla_outbox.queries`, the one place SQL is built:

============================  =======================================================
:class:`SqlStore`             each step a transaction of Core statements (the base)
:class:`PostgresStore`        PostgreSQL through any driver: one autocommit statement
                              per step, the write-back riding on the claim
:class:`PsycopgStore`         PostgreSQL through psycopg 3: pre-compiled driver SQL,
                              cursor rows, LISTEN
:class:`SQLiteStore`          a claim under SQLite's write lock
:class:`MySQLStore`           MySQL 8.0+ / MariaDB 10.6+: lock and read, guard, stamp
============================  =======================================================

The same conformance suite (``tests/stores``) runs on every one of them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.errors import ConfigurationError
from sqla_outbox.preflight import SUPPORTED_DATABASES, engine_from_url, resolve_bind
from sqla_outbox.queries import stage_stmt
from sqla_outbox.stores import psycopg
from sqla_outbox.stores.base import SqlStore
from sqla_outbox.stores.mysql import MySQLStore
from sqla_outbox.stores.postgresql import PostgresStore
from sqla_outbox.stores.psycopg import PsycopgStore
from sqla_outbox.stores.sqlite import SQLiteStore

__all__ = [
    "MySQLStore",
    "PostgresStore",
    "PsycopgStore",
    "SQLiteStore",
    "SqlStore",
    "insert_staged",
    "open_store",
    "relay_engine",
]


def open_store(engine: Engine, **settings: Any) -> SqlStore:
    """The store for ``engine``'s database and driver, with a relay's ``settings``."""
    name = engine.dialect.name
    if name == "postgresql":
        if psycopg.applies(engine.dialect, engine.get_execution_options()):
            return PsycopgStore(engine, **settings)
        return PostgresStore(engine, **settings)
    if name == "sqlite":
        return SQLiteStore(engine, **settings)
    if name in MYSQL_DIALECTS:
        return MySQLStore(engine, **settings)
    raise ConfigurationError(
        f"relays cannot run on {name!r}; sqla-outbox supports {SUPPORTED_DATABASES}."
    )


def relay_engine(bind: object) -> Engine:
    """The engine a relay given ``bind`` runs on.

    Refused before any connection, as :class:`ConfigurationError`: a malformed URL, an
    unsupported database, a driver that is not installed or is asyncio-only. An ``AsyncEngine``
    on psycopg 3 or aiosqlite becomes its synchronous twin's URL (see
    :mod:`sqla_outbox.preflight`). A claim on SQLite must hold the write lock from its first
    statement (``BEGIN IMMEDIATE``); rather than add listeners to the caller's engine, a relay on
    an SQLite file uses an engine of its own.
    """
    resolved = resolve_bind(bind)
    if isinstance(resolved, Engine):
        url: URL = resolved.url
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return resolved
        resolved = url
    return engine_from_url(resolved, immediate=True, utc=True)


def insert_staged(connection: Connection, rows: list[dict[str, Any]]) -> None:
    """INSERT staged ``rows`` (:func:`~sqla_outbox.queries.stage_rows`) on an enqueuing
    transaction's ``connection``, in one statement (an executemany for several): on psycopg as
    pre-compiled driver SQL (:func:`PsycopgStore`'s module), elsewhere as the Core INSERT."""
    if psycopg.applies(connection.dialect, connection.get_execution_options()):
        psycopg.insert_staged(connection, rows)
    else:
        connection.execute(stage_stmt(), rows)
