"""The outbox table's column types: aware-UTC timestamps and JSON, the same on every dialect.

They live apart from :mod:`sqla_outbox.model` because the frozen table versions
(:mod:`sqla_outbox.versions`) are built from them and the model is built from those versions.
A type here is part of every released table version that uses it: what it emits as DDL
(``TIMESTAMP WITH TIME ZONE``, ``JSONB``) must never change; only its Python-side conversions may.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, Dialect, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.operators import OperatorType
from sqlalchemy.types import TypeEngine

__all__ = ["JSON_TYPE", "UTCDateTime", "as_utc"]

JSON_TYPE = JSON().with_variant(JSONB(), "postgresql")
"""The ``input`` column's type: JSON, ``jsonb`` on PostgreSQL."""


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` with ``timezone.utc``; a naive value (SQLite's) is taken to be UTC already."""
    if value.tzinfo is dt.timezone.utc:
        return value  # the common case: nothing to do
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """An aware-UTC ``datetime`` on every dialect.

    PostgreSQL's ``timestamptz`` already round-trips aware values; SQLite stores text and gives
    back naive ones. Values are converted to UTC on the way in and stamped UTC on the way out, so
    comparisons and the text SQLite sorts by agree. A naive value is refused rather than guessed:
    the outbox cannot know which zone it meant.

    In expressions it types like ``DateTime(timezone=True)``: ``OutboxRow.staged_at -
    timedelta(days=1)`` binds the ``timedelta`` as an ``Interval`` and is itself a
    ``UTCDateTime`` (so it comes back aware), and ``staged_at - claimed_at`` is an ``Interval``.
    Only ``datetime`` operands go through this type's conversion (and its refusal of naive values).
    SQLite has no interval type and no timestamp operators: there, as with a plain ``DateTime``
    column, ``staged_at - timedelta(...)`` does not give back a ``datetime``. Compute the bound in
    Python (``staged_at < now - timedelta(days=1)``) for queries that must run on both.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def coerce_compared_value(self, op: OperatorType | None, value: Any) -> TypeEngine[Any]:
        # A TypeDecorator's default binds every operand of an expression with the decorator
        # itself, so a timedelta reached process_bind_param as if it were a datetime. Datetimes
        # keep this type (UTC conversion, naive values refused); anything else is typed as
        # DateTime would type it: timedelta -> Interval, date -> Date, and so on.
        if isinstance(value, dt.datetime):
            return self
        return self.impl_instance.coerce_compared_value(op, value)

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(
                f"outbox timestamps must be timezone-aware, got naive {value!r}. "
                "Use datetime.now(timezone.utc) or attach a tzinfo."
            )
        value = value.astimezone(dt.timezone.utc)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        return None if value is None else as_utc(value)
