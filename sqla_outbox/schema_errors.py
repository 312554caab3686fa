"""Recognise "the outbox table does not exist" or "is too old" and say how to fix it.

A missing table is the one database error a new user is certain to meet (the migration was not
run), and the driver's wording ("relation does not exist", "no such table") names neither the
cause nor the fix. A table of an older schema version (:mod:`sqla_outbox.versions`) is the
error every user meets once after upgrading sqla-outbox without adding the upgrade migration;
the driver says "column ... does not exist" / "no such column" / "has no column named" /
"Unknown column", and
:func:`raise_if_missing_table` turns that, for a column a later table version added, into
:class:`SchemaVersionError` naming ``op.upgrade_outbox_table``. A role without the privileges it
needs is the third; start-up checks it (:mod:`sqla_outbox.preflight`), and
:func:`is_permission_denied` recognises it afterwards, when a grant is revoked from a running
relay.

The trap: a missing column is recognised from the driver's message, and only for the columns a
later version added (``ordering_key``, ``parked``, ...). The version reported is the one before
the version that added the column the statement happened to reach first, which is the table's
version whenever it is one version behind; :func:`~sqla_outbox.versions.table_version` (used by
the start-up check) reads the exact one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.exc import DBAPIError, OperationalError

from sqla_outbox.engines import hide_password
from sqla_outbox.errors import MissingTableError, SchemaVersionError
from sqla_outbox.model import OutboxRow
from sqla_outbox.versions import SCHEMA_VERSION, version_added

__all__ = [
    "is_missing_table",
    "is_permission_denied",
    "missing_column",
    "missing_table_error",
    "outdated_table_error",
    "raise_if_missing_table",
    "raise_if_outdated_table",
]

_TABLE: Table = OutboxRow.__table__  # type: ignore[assignment]

_UNDEFINED_TABLE = "42P01"  # PostgreSQL's SQLSTATE for an undefined table
_UNDEFINED_COLUMN = "42703"
_INSUFFICIENT_PRIVILEGE = "42501"
# MySQL and MariaDB error numbers (the first argument of the driver's error, in PyMySQL and
# mysqlclient alike): no such table, no such column.
_MYSQL_NO_SUCH_TABLE = 1146
_MYSQL_BAD_FIELD = 1054

_IDENTIFIER = r"[\w$]+"
# PostgreSQL: 'column "parked" of relation "outbox" does not exist' (INSERT, UPDATE ... SET),
# 'column outbox.parked does not exist' (a qualified reference). SQLite: 'no such column:
# outbox.parked', 'no such column: parked', 'table outbox has no column named parked'. MySQL and
# MariaDB: "Unknown column 'parked' in 'field list'", "Unknown column 'outbox.parked' in ...".
_MISSING_COLUMN = (
    re.compile(
        rf'column (?:"?{_IDENTIFIER}"?\.)?"?({_IDENTIFIER})"?(?: of relation "[^"]*")? '
        "does not exist"
    ),
    re.compile(rf"no such column: (?:{_IDENTIFIER}\.)?({_IDENTIFIER})"),
    re.compile(rf"has no column named ({_IDENTIFIER})"),
    re.compile(rf"Unknown column '(?:{_IDENTIFIER}\.)*({_IDENTIFIER})'"),
)


def _mysql_error_number(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_missing_table(error: DBAPIError) -> bool:
    """True if the driver error says a table does not exist."""
    if getattr(error.orig, "sqlstate", None) == _UNDEFINED_TABLE:
        return True
    if _mysql_error_number(error) == _MYSQL_NO_SUCH_TABLE:
        return True
    return "no such table" in str(error.orig)


_REFUSED_LOGIN = ("28", "3D")
"""SQLSTATE classes of a server that answered and refused: bad credentials (28), no such
database (3D). Waiting does not fix them."""
_PG_REFUSED_LOGIN = re.compile(
    r"FATAL: +(?:(?:database|role) \"[^\"]*\" does not exist|password authentication failed"
    r"|no pg_hba\.conf entry|permission denied for database|.* authentication failed)"
)
_MYSQL_REFUSED_LOGIN = frozenset({1044, 1045, 1049})
"""MySQL/MariaDB: access denied to the database (1044) or for the user (1045), unknown
database (1049)."""


def is_unreachable(error: BaseException) -> bool:
    """True if ``error`` says the database could not be reached or dropped the connection (a
    server down or restarting, a connection killed, a network fault): something that waiting can
    fix. False for a server that answered and refused (bad credentials, no such database), for
    SQLite (no server to wait for) and for any other error."""
    if not isinstance(error, OperationalError):
        return False
    orig = error.orig
    if type(orig).__module__.startswith("sqlite3"):
        return False
    number = _mysql_error_number(error)
    if number is not None:
        return number not in _MYSQL_REFUSED_LOGIN
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(sqlstate, str):
        return not sqlstate.startswith(_REFUSED_LOGIN)
    # A refused login carries no SQLSTATE through libpq's connect: only its text says it.
    return _PG_REFUSED_LOGIN.search(str(orig)) is None


def is_permission_denied(error: DBAPIError) -> bool:
    """True if the driver error says the role lacks a privilege (PostgreSQL's SQLSTATE 42501)."""
    return getattr(error.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE


def missing_column(error: DBAPIError) -> str | None:
    """The column a driver error says does not exist, or ``None`` if it says something else."""
    number = _mysql_error_number(error)
    sqlstate = getattr(error.orig, "sqlstate", None)
    if number is not None:  # MySQL's own SQLSTATEs ("42S22") are not PostgreSQL's
        if number != _MYSQL_BAD_FIELD:
            return None
    elif sqlstate is not None and sqlstate != _UNDEFINED_COLUMN:
        return None
    message = str(error.orig)
    for pattern in _MISSING_COLUMN:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


def _table_name(bind: Connection | Engine) -> str:
    """The outbox table's name as ``bind`` reaches it (schema-qualified if it has a schema)."""
    table = _TABLE
    schema = table.schema
    if isinstance(bind, Connection):
        translate = bind.get_execution_options().get("schema_translate_map") or {}
        schema = translate.get(schema, schema)
    return table.name if schema is None else f"{schema}.{table.name}"


def missing_table_error(bind: Connection | Engine) -> MissingTableError:
    """The error, with the fix, for an outbox table that is not in ``bind``'s database."""
    return MissingTableError(
        f"Connected to {hide_password(bind.engine.url)} but table {_table_name(bind)!r} was not "
        f"found. Create it with op.create_outbox_table(version={SCHEMA_VERSION}) in a migration "
        "and run alembic upgrade head (or outbox.metadata.create_all(engine) in tests)."
    )


def outdated_table_error(
    table: str, found: int, needed: int = SCHEMA_VERSION
) -> SchemaVersionError:
    """The error, with the migration that fixes it, for table ``table`` at version ``found``."""
    return SchemaVersionError(
        f"Table {table!r} is schema version {found}; this sqla-outbox needs version {needed}. "
        f"Add a migration with op.upgrade_outbox_table({found}, {needed}) and run alembic "
        "upgrade head."
    )


def _outdated(bind: Connection | Engine, error: DBAPIError) -> SchemaVersionError | None:
    column = missing_column(error)
    added = None if column is None else version_added(column)
    if added is None or added == 1:
        return None  # not a column of ours, or one every version has: not a version problem
    return outdated_table_error(_table_name(bind), added - 1)


@contextmanager
def raise_if_outdated_table(bind: Connection | Engine) -> Iterator[None]:
    """Turn a missing-column error raised inside the block, for a column a later table version
    added, into :class:`SchemaVersionError` (see the module docs)."""
    try:
        yield
    except DBAPIError as error:
        outdated = _outdated(bind, error)
        if outdated is not None:
            raise outdated from error
        raise


@contextmanager
def raise_if_missing_table(bind: Connection | Engine) -> Iterator[None]:
    """Turn a missing-table error raised inside the block into :class:`MissingTableError`, and
    a table of an older version into :class:`SchemaVersionError` (as
    :func:`raise_if_outdated_table` does)."""
    try:
        yield
    except DBAPIError as error:
        if is_missing_table(error):
            raise missing_table_error(bind) from error
        outdated = _outdated(bind, error)
        if outdated is not None:
            raise outdated from error
        raise
