"""The two hot statements, compiled once and sent as driver SQL on PostgreSQL through psycopg.

A relay pass and the commit of an enqueuing transaction each run one or two statements, many
times a second. Through ``Connection.execute`` every one of them pays SQLAlchemy's per-statement
work: a cache key for the construct, a compiled-cache lookup, bind processing per value and
result set-up; on the enqueue path it cost a tenth of a small web transaction. So on psycopg,
the statements are compiled from :mod:`sqla_outbox.queries` once per dialect and executed with
``Connection.exec_driver_sql`` and values psycopg adapts natively (``uuid.UUID``, aware
datetimes, ``Jsonb``). That keeps what matters of SQLAlchemy: the statement still goes through
the session's ``Connection`` and transaction, fires ``before_cursor_execute`` and
``after_cursor_execute`` (SQL logging and tracing instrumentation see it), and a driver error
still arrives as SQLAlchemy's exception, with disconnects detected.

Every other dialect and driver, and any connection with a ``schema_translate_map``, executes the
Core statements as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Dialect
from sqlalchemy.sql.expression import ClauseElement

__all__ = ["Precompiled", "applies", "precompile"]


@dataclass(frozen=True, slots=True)
class Precompiled:
    """A statement's SQL text for one dialect and the literal parameters compiled into it."""

    sql: str
    constants: dict[str, Any]

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` completed with the statement's own constants (``LIMIT 1`` and the like)."""
        return {**self.constants, **params} if self.constants else params


def applies(dialect: Dialect, execution_options: Mapping[str, Any]) -> bool:
    """True where statements run as pre-compiled driver SQL: PostgreSQL through psycopg.

    Not under a ``schema_translate_map``: SQLAlchemy applies it when it executes a construct,
    and a string compiled in advance would name the untranslated table.
    """
    return (
        dialect.name == "postgresql"
        and dialect.driver == "psycopg"
        and not execution_options.get("schema_translate_map")
    )


def precompile(
    statement: ClauseElement, dialect: Dialect, column_keys: tuple[str, ...] = ()
) -> Precompiled:
    """``statement`` compiled for ``dialect``; callers keep the result for as long as it serves.

    ``column_keys`` names the columns an INSERT's parameter rows carry, so the compiled VALUES
    list has exactly those.
    """
    compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) or None)
    return Precompiled(str(compiled), dict(compiled.params))
