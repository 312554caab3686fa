"""Start-up checks: refuse what sqla-outbox cannot use before using it, in one sentence.

The relay and the console script run these before their first real statement, so a mistake a
user can make is reported as what it is, with the fix, instead of as a driver traceback, a SQL
syntax error from another database, or a relay that logs the same "permission denied" forever.

What is checked, and when:

* **The URL** (:func:`database_url`), before any driver is imported or any connection is
  opened: it parses (a port that is not a number, an ``@`` in a password not written ``%40``);
  it names PostgreSQL, SQLite, MySQL or MariaDB (the dialect is the URL's scheme, so any other
  is refused before its driver is imported); SQLAlchemy knows its driver.
* **The driver** (:func:`engine_from_url`): its module is installed.
* **The bind** given to a relay or to an operator function (:func:`resolve_bind`, and
  :func:`operator_engine` for the latter): an ``Engine`` of a supported database, or a URL as
  above.
  Everything here raises :class:`~sqla_outbox.errors.ConfigurationError`.
* **The table** (:func:`check_outbox_table`), on a connection: it exists
  (:class:`~sqla_outbox.errors.MissingTableError`), and on PostgreSQL the connected role holds
  the privileges the caller needs on it (:class:`~sqla_outbox.errors.MissingPrivilegeError`),
  both in one statement. SQLite has no privileges; MySQL's are not checked (a statement the
  role may not run fails with the server's own message). Then its schema version is at least
  :data:`~sqla_outbox.versions.SCHEMA_VERSION` (:class:`~sqla_outbox.errors.SchemaVersionError`
  naming ``op.upgrade_outbox_table``), read from the table's comment or columns.

Asyncio drivers. The relay runs in threads and cannot drive an asyncio-only DBAPI: the
``sync_engine`` of an ``AsyncEngine`` on psycopg 3 wraps psycopg's async connection in an
adaptor that must run inside SQLAlchemy's greenlet bridge, and fails with ``MissingGreenlet``
anywhere else. Where the same library also has a synchronous driver (psycopg 3, and ``aiosqlite``,
which wraps ``sqlite3``), an ``AsyncEngine`` or an async URL is taken as the URL of that
synchronous twin and the relay opens its own connections, as it already does for an SQLite file.
Only the URL carries over: options given to ``create_async_engine`` (``connect_args``, pool
settings) do not; pass a synchronous ``Engine`` built with them if they matter. Any other asyncio
driver (asyncpg) is refused with the psycopg URL to use instead.

The trap: the privilege check reads table-level grants (``has_table_privilege``). A role given
only column-level ``UPDATE`` on the outbox's columns is refused although the relay could work.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import ArgumentError

from sqla_outbox.engines import create_engine, hide_password
from sqla_outbox.errors import ConfigurationError, MissingPrivilegeError
from sqla_outbox.queries.terms import outbox_table
from sqla_outbox.schema_errors import (
    missing_table_error,
    outdated_table_error,
    raise_if_missing_table,
)
from sqla_outbox.versions import SCHEMA_VERSION, inspected_version

__all__ = [
    "BIND_FIX",
    "RELAY_PRIVILEGES",
    "STATUS_PRIVILEGES",
    "SUPPORTED_DATABASES",
    "check_dialect",
    "check_outbox_table",
    "checked_transaction",
    "database_url",
    "engine_from_url",
    "operator_engine",
    "resolve_bind",
    "table_access_stmt",
]

_EXAMPLE = "postgresql+psycopg://user:password@host/dbname"
_MYSQL_EXAMPLE = "mysql+pymysql://user:password@host/dbname"
SUPPORTED_DATABASES = (
    f"PostgreSQL (through psycopg 3, e.g. {_EXAMPLE}, or another SQLAlchemy driver), "
    f"SQLite (e.g. sqlite:///path/to/app.db) and MySQL/MariaDB (through PyMySQL, e.g. "
    f"{_MYSQL_EXAMPLE})"
)
BIND_FIX = f"Pass an Engine or a URL such as {_EXAMPLE} or sqlite:///path/to/app.db."

# What each caller runs on the outbox table (see sqla_outbox.queries). The relay's claim is an
# UPDATE that reads the rows it locks (SELECT ... FOR UPDATE, RETURNING); marks and releases are
# UPDATEs; pending() reads. ``status`` only reads.
RELAY_PRIVILEGES = ("SELECT", "UPDATE")
STATUS_PRIVILEGES = ("SELECT",)

_UNCLOSED_IPV6 = re.compile(r"(?:@|//)\[[^\]/?#]*(?:[/?#]|$)")
"""A host that opens an IPv6 bracket and never closes it before the path, query or end."""

_BACKENDS = {"postgresql": "PostgreSQL", "sqlite": "SQLite", "mysql": "MySQL", "mariadb": "MariaDB"}
# The driver of the same library that runs without asyncio, by (backend, async driver).
_SYNC_TWINS = {("postgresql", "psycopg"): "postgresql+psycopg", ("sqlite", "aiosqlite"): "sqlite"}
# What to suggest instead of a driver sqla-outbox cannot use: one that is always installed (on
# MySQL and MariaDB, the one the ``mysql`` extra installs).
_DEFAULT_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "sqlite": "sqlite",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
_MAX_PORT = 65535


# --- URLs and binds ----------------------------------------------------------------------------


def database_url(url: str | URL, *, source: str = "bind", fix: str = BIND_FIX) -> URL:
    """``url`` parsed and checked without importing a driver or connecting (see module docs).

    ``source`` is how the caller's user supplied the URL (``"bind"``, ``"--url"``) and starts
    every message; ``fix`` ends the messages that have no more specific fix. An async driver
    with a synchronous twin comes back as the twin's URL.
    """
    what = f"{source} {hide_password(url)!r}"
    try:
        parsed = sa.make_url(url)
    except ArgumentError as error:
        raise ConfigurationError(f"{what} is not a database URL. {fix}") from error
    except ValueError as error:  # SQLAlchemy's int(port)
        if _UNCLOSED_IPV6.search(str(url)):
            raise ConfigurationError(
                f"{what} is not a database URL: its IPv6 host has no closing ']'. Write the "
                "address in brackets, then the port, e.g. postgresql+psycopg://user@[::1]:5432/db."
            ) from error
        raise ConfigurationError(
            f"{what} is not a database URL: its port must be a whole number from 1 to "
            f"{_MAX_PORT}. {fix}"
        ) from error
    if parsed.port is not None and not 1 <= parsed.port <= _MAX_PORT:
        raise ConfigurationError(
            f"{what} has the port {parsed.port}, which is not from 1 to {_MAX_PORT}. {fix}"
        )
    if parsed.host and "@" in parsed.host:
        raise ConfigurationError(
            f"{what} has an '@' in its password or user name; write it as %40 there, since an "
            "'@' ends the password."
        )
    backend = parsed.get_backend_name()
    if backend == "postgres":
        raise ConfigurationError(
            f"{what} starts with 'postgres://', which SQLAlchemy does not accept; write "
            "postgresql+psycopg:// instead."
        )
    if backend not in _BACKENDS:
        raise ConfigurationError(_unsupported(what, backend))
    try:
        dialect = parsed.get_dialect()
    except ArgumentError as error:  # NoSuchModuleError: no such driver for this dialect
        raise ConfigurationError(
            f"{what} names the driver {parsed.drivername.partition('+')[2]!r}, which SQLAlchemy "
            f"does not have for {_BACKENDS[backend]}; use "
            f"{_suggest(parsed, backend)!r} instead."
        ) from error
    if not dialect.is_async:
        return parsed
    twin = _SYNC_TWINS.get((backend, dialect.driver))
    if twin is None:
        raise ConfigurationError(
            f"{what} uses the asyncio driver {dialect.driver!r}, which sqla-outbox cannot use (it "
            f"runs in threads, without an event loop); use {_suggest(parsed, backend)!r} "
            "instead."
        )
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigurationError(
            f"{what} is an in-memory SQLite database behind an asyncio driver, which sqla-outbox "
            "cannot reach from its own connections; use an SQLite file, e.g. "
            "sqlite+aiosqlite:///path/to/app.db."
        )
    return parsed.set(drivername=twin)


def engine_from_url(
    url: str | URL, *, source: str = "bind", fix: str = BIND_FIX, **kwargs: Any
) -> Engine:
    """:func:`~sqla_outbox.engines.create_engine` for ``url`` after :func:`database_url`, with
    a driver that is not installed reported as :class:`ConfigurationError` (no connection)."""
    parsed = database_url(url, source=source, fix=fix)
    what = f"{source} {hide_password(parsed)!r}"
    try:
        return create_engine(parsed, **kwargs)
    except ImportError as error:
        backend = parsed.get_backend_name()
        raise ConfigurationError(
            f"{what} needs the driver module {error.name or str(error)!r}, which is not "
            f"installed in this Python environment; install it, or use "
            f"{_suggest(parsed, backend)!r} instead."
        ) from error
    except (ArgumentError, ValueError) as error:
        # An option in the query string the dialect cannot take (``sqlite:///app.db?timeout=x``).
        raise ConfigurationError(
            f"{what} has an option the driver cannot take ({error}). Fix or remove it in the "
            "query string."
        ) from error


def resolve_bind(bind: object) -> Engine | URL:
    """What a relay or an operator function given ``bind`` should use: a supported ``Engine``
    as it is, or a checked URL.

    An ``AsyncEngine`` (or an ``Engine`` whose driver is asyncio-only) becomes the URL of its
    synchronous twin, or is refused (see module docs).
    """
    # An AsyncEngine exists only if SQLAlchemy's asyncio extension was imported: look for it
    # there, so that plain-sync users never import it (nor greenlet) through us.
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is not None and isinstance(bind, asyncio_ext.AsyncEngine):
        return database_url(bind.url, source="bind (an AsyncEngine)")
    if isinstance(bind, Engine):
        check_dialect(bind)
        if bind.dialect.is_async:
            return database_url(bind.url, source="bind (an Engine with an asyncio driver)")
        return bind
    if isinstance(bind, (str, URL)):
        return database_url(bind)
    raise ConfigurationError(
        f"bind must be an Engine or a database URL such as {_EXAMPLE}, got {bind!r}."
    )


@contextmanager
def operator_engine(bind: Engine | str | URL) -> Iterator[Engine]:
    """``bind`` as an engine for a one-off operator call (``purge``, the dead-letter functions):
    the caller's own, or one made for a URL and disposed afterwards."""
    resolved = resolve_bind(bind)
    if isinstance(resolved, Engine):
        yield resolved
        return
    engine = engine_from_url(resolved, utc=True)
    try:
        yield engine
    finally:
        engine.dispose()


def check_dialect(engine: Engine) -> None:
    """Raise :class:`ConfigurationError` unless ``engine`` is on a supported database."""
    name = engine.dialect.name
    what = f"bind {hide_password(engine.url)!r}"
    if name not in _BACKENDS:
        raise ConfigurationError(_unsupported(what, name))


def _unsupported(what: str, backend: str) -> str:
    return (
        f"{what} is for {backend!r}, which sqla-outbox does not support; it supports "
        f"{SUPPORTED_DATABASES}."
    )


def _suggest(url: URL, backend: str) -> str:
    return hide_password(url.set(drivername=_DEFAULT_DRIVERS[backend]))


# --- the table ---------------------------------------------------------------------------------

_pg_class = sa.table(
    "pg_class",
    sa.column("oid"),
    sa.column("relname"),
    sa.column("relnamespace"),
    sa.column("relkind"),
    schema="pg_catalog",
)
_pg_namespace = sa.table(
    "pg_namespace", sa.column("oid"), sa.column("nspname"), schema="pg_catalog"
)


def table_access_stmt(name: str, schema: str | None, privileges: Sequence[str]) -> sa.Select[Any]:
    """One row if table ``name`` exists (in ``schema``, or the first on the search path), with
    its schema, the current role, whether the role may use the schema, and one boolean per
    privilege in ``privileges``; no row if it does not exist. PostgreSQL only.

    Reads the catalogs by name rather than ``to_regclass``, which raises instead of answering
    when the role lacks ``USAGE`` on the schema.
    """
    where = [_pg_class.c.relname == name, _pg_class.c.relkind.in_(("r", "p"))]
    if schema is None:
        where.append(sa.func.pg_catalog.pg_table_is_visible(_pg_class.c.oid))
    else:
        where.append(_pg_namespace.c.nspname == schema)
    return (
        sa.select(
            _pg_namespace.c.nspname,
            sa.func.current_user(),
            sa.func.has_schema_privilege(_pg_namespace.c.oid, "USAGE", type_=sa.Boolean),
            *(
                sa.func.has_table_privilege(_pg_class.c.oid, privilege, type_=sa.Boolean)
                for privilege in privileges
            ),
        )
        .select_from(_pg_class.join(_pg_namespace, _pg_class.c.relnamespace == _pg_namespace.c.oid))
        .where(*where)
    )


def check_outbox_table(
    conn: Connection,
    privileges: Sequence[str],
    *,
    needed_by: str,
    minimum: int = SCHEMA_VERSION,
) -> None:
    """Raise unless the outbox table exists and, on PostgreSQL, the role holds ``privileges``,
    and the table is at least schema version ``minimum`` (by default the one this release
    needs; an operation that reads no later version's columns may ask for less).

    :class:`MissingTableError` names the migration to run; :class:`MissingPrivilegeError` names
    the role, what it lacks, and the ``GRANT`` (``needed_by`` says who needs it, e.g. ``"the
    relay"``); :class:`SchemaVersionError` names the ``op.upgrade_outbox_table`` migration. The
    table's schema honours the connection's ``schema_translate_map``.
    """
    table = outbox_table
    translate = conn.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(table.schema, table.schema)
    if conn.dialect.name != "postgresql":
        if not sa.inspect(conn).has_table(table.name, schema=schema):
            raise missing_table_error(conn)
        name = table.name if schema is None else f"{schema}.{table.name}"
        _check_version(conn, name, schema, minimum)
        return
    row = conn.execute(table_access_stmt(table.name, schema, privileges)).first()
    if row is None:
        raise missing_table_error(conn)
    namespace, role, schema_usage, *held = row
    lacking = [privilege for privilege, ok in zip(privileges, held, strict=True) if not ok]
    if schema_usage and not lacking:
        _check_version(conn, f"{namespace}.{table.name}", namespace, minimum)
        return
    preparer = conn.dialect.identifier_preparer
    table_sql = f"{preparer.quote_schema(namespace)}.{preparer.quote(table.name)}"
    role_sql = preparer.quote(role)
    missing, grants = [], []
    if not schema_usage:
        missing.append(f"USAGE on schema {namespace!r}")
        grants.append(f"GRANT USAGE ON SCHEMA {preparer.quote_schema(namespace)} TO {role_sql};")
    if lacking:
        missing.append(f"{_and(lacking)} on table {f'{namespace}.{table.name}'!r}")
        grants.append(f"GRANT {', '.join(lacking)} ON {table_sql} TO {role_sql};")
    pronoun = "it" if len(lacking) + (not schema_usage) == 1 else "them"
    raise MissingPrivilegeError(
        f"Role {role!r} lacks {' and '.join(missing)}, which {needed_by} needs. "
        f"Grant {pronoun}: {' '.join(grants)}"
    )


def _check_version(conn: Connection, name: str, schema: str | None, minimum: int) -> None:
    """Raise :class:`SchemaVersionError` (naming the upgrade to :data:`SCHEMA_VERSION`) if table
    ``name`` is older than ``minimum``.

    A table whose version cannot be told (not even version 1's columns) is left to the
    statements that use it: it is not an outbox any version of sqla-outbox created.
    """
    found = inspected_version(sa.inspect(conn), outbox_table.name, schema)
    if found is not None and found < minimum:
        raise outdated_table_error(name, found)


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


@contextmanager
def checked_transaction(
    bind: Engine | str | URL, privileges: Sequence[str], needed_by: str
) -> Iterator[Connection]:
    """A transaction on ``bind`` (see :func:`operator_engine`) after the table's checks: a
    missing table, a missing privilege or an older schema is one sentence with the fix, raised
    before the operator call reads or changes anything."""
    with operator_engine(bind) as engine, raise_if_missing_table(engine), engine.begin() as conn:
        check_outbox_table(conn, privileges, needed_by=needed_by)
        yield conn
