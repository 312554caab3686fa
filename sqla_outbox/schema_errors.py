"""Recognise "the outbox table does not exist" and say how to create it.

A missing table is the one database error a new user is certain to meet (the migration was not
run), and the driver's wording ("relation does not exist", "no such table") names neither the
cause nor the fix. A role without the privileges it needs is the second; start-up checks it
(:mod:`sqla_outbox.preflight`), and :func:`is_permission_denied` recognises it afterwards, when
a grant is revoked from a running relay.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from sqla_outbox.engines import hide_password
from sqla_outbox.errors import MissingTableError
from sqla_outbox.model import OutboxRow

__all__ = [
    "is_missing_table",
    "is_permission_denied",
    "missing_table_error",
    "raise_if_missing_table",
]

_UNDEFINED_TABLE = "42P01"  # PostgreSQL's SQLSTATE for an undefined table
_INSUFFICIENT_PRIVILEGE = "42501"


def is_missing_table(error: DBAPIError) -> bool:
    """True if the driver error says a table does not exist."""
    if getattr(error.orig, "sqlstate", None) == _UNDEFINED_TABLE:
        return True
    return "no such table" in str(error.orig)


def is_permission_denied(error: DBAPIError) -> bool:
    """True if the driver error says the role lacks a privilege (PostgreSQL's SQLSTATE 42501)."""
    return getattr(error.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE


def missing_table_error(bind: Connection | Engine) -> MissingTableError:
    """The error, with the fix, for an outbox table that is not in ``bind``'s database."""
    table = OutboxRow.__table__.fullname  # type: ignore[attr-defined]
    return MissingTableError(
        f"Connected to {hide_password(bind.engine.url)} but table {table!r} was not found. "
        "Create it with op.create_outbox_table() in a migration and run alembic upgrade head "
        "(or outbox.metadata.create_all(engine) in tests)."
    )


@contextmanager
def raise_if_missing_table(bind: Connection | Engine) -> Iterator[None]:
    """Turn a missing-table error raised inside the block into :class:`MissingTableError`."""
    try:
        yield
    except DBAPIError as error:
        if is_missing_table(error):
            raise missing_table_error(bind) from error
        raise
