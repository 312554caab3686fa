"""The outbox table's column types: ids, aware-UTC timestamps and JSON, the same on every dialect.

They live apart from :mod:`sqla_outbox.model` because the frozen table versions
(:mod:`sqla_outbox.versions`) are built from them and the model is built from those versions.
A type here is part of every released table version that uses it: what it emits as DDL
(``TIMESTAMP WITH TIME ZONE``, ``JSONB``; on MySQL and MariaDB ``DATETIME(6)``, ``BINARY(16)``)
must never change; only its Python-side conversions may.

On MySQL and MariaDB (dialect names :data:`MYSQL_DIALECTS`):

* Timestamps are ``DATETIME(6)``: microseconds, as ``timestamptz`` keeps them (a bare
  ``DATETIME`` rounds them away), holding the UTC wall-clock time with no zone, as SQLite's text
  does. ``DATETIME`` rather than ``TIMESTAMP``: ``TIMESTAMP`` converts through the session's
  ``time_zone`` and ends in 2038.
* Ids are ``BINARY(16)``, the UUID's sixteen bytes in order (:class:`BinaryUUID`).
* ``input`` is ``JSON`` (on MariaDB an alias of ``LONGTEXT`` checked by ``JSON_VALID``).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from sqlalchemy import BINARY, JSON, DateTime, Dialect, Text, TypeDecorator, Uuid
from sqlalchemy.dialects.mysql import DATETIME
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.operators import OperatorType
from sqlalchemy.types import TypeEngine

__all__ = [
    "ID_TYPE",
    "JSON_TYPE",
    "MYSQL_DIALECTS",
    "BinaryUUID",
    "InputText",
    "UTCDateTime",
    "UndecodableInput",
    "as_utc",
    "undecodable",
]

MYSQL_DIALECTS = ("mysql", "mariadb")
"""SQLAlchemy's names for MySQL and MariaDB: ``mysql://`` URLs give ``"mysql"`` whichever server
answers, ``mariadb://`` URLs ``"mariadb"``. A variant or a check for one must name both."""

JSON_TYPE = JSON().with_variant(JSONB(), "postgresql")
"""The ``input`` column's type: JSON, ``jsonb`` on PostgreSQL."""


class UndecodableInput(str):
    """A stored ``input`` that is not JSON Python can read: its text as stored, and ``reason``,
    why it could not be decoded.

    Only a row written without :func:`~sqla_outbox.enqueue` (by hand, by another program) can
    hold one: text that is not JSON in SQLite's unchecked ``JSON``, or ``jsonb`` nested deeper
    than Python's recursion limit lets ``json.loads`` go (``enqueue`` refuses both). The relay
    charges such a row as a failed publish instead of publishing it (it becomes a dead letter
    like any message that keeps failing), and :func:`~sqla_outbox.dead_letters` and ``status``
    show it as the text it is, instead of one row making every read of the outbox raise.
    """

    reason: str


def undecodable(text: str, error: BaseException) -> UndecodableInput:
    """``text``, which ``error`` kept from decoding, as an :class:`UndecodableInput`."""
    stored = UndecodableInput(text)
    stored.reason = f"{type(error).__name__}: {error}"
    return stored


class InputText(TypeDecorator[Any]):
    """``input`` selected as its JSON text (``CAST(input AS TEXT)``, see
    ``sqla_outbox.queries``) and decoded here: as the
    dialect's JSON type would (its ``json_deserializer``, else ``json.loads``), except that a
    value that does not decode comes back as :class:`UndecodableInput` instead of failing the
    whole result."""

    impl = Text
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        loads = getattr(dialect, "_json_deserializer", None) or json.loads

        def process(value: Any) -> Any:
            if value is None:
                return None
            try:
                return loads(value)
            except (ValueError, RecursionError) as error:
                return undecodable(value if isinstance(value, str) else repr(value), error)

        return process


class BinaryUUID(TypeDecorator[uuid.UUID]):
    """A ``uuid.UUID`` stored as ``BINARY(16)``, its sixteen bytes in big-endian order.

    The outbox's ids are UUIDv7 (:mod:`sqla_outbox.ids`): their leading bytes are the
    millisecond, so byte order is the order they were made, and claim order ``(staged_at, id)``
    needs the database to sort them exactly so. ``BINARY`` compares byte by byte (``memcmp``),
    as PostgreSQL's ``uuid`` does and as SQLite's 32-character hex text sorts. Why not the others:

    * SQLAlchemy's ``Uuid`` alone gives ``CHAR(32)`` on a ``mysql://`` URL but MariaDB's native
      ``UUID`` on a ``mariadb://`` URL: the same migration would build two different tables.
    * MariaDB's own ``UUID`` type (10.7+; MySQL has none) sorts some UUIDs by a reordering of
      their groups (meant for time-based version 1), a rule that has changed between releases.
    * ``CHAR(32)`` sorts right only under a binary collation, and is twice the size: InnoDB
      repeats the primary key in every secondary index, and the outbox has seven.

    The bytes are ``UUID.bytes`` (not MySQL's ``UUID_TO_BIN(..., 1)``, whose swap is for version
    1 UUIDs): ``HEX(id)`` in a MySQL shell is the id without its dashes.
    """

    impl = BINARY(16)
    cache_ok = True

    def process_bind_param(self, value: uuid.UUID | str | None, dialect: Dialect) -> bytes | None:
        if value is None:
            return None
        return (value if isinstance(value, uuid.UUID) else uuid.UUID(value)).bytes

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> uuid.UUID | None:
        return None if value is None else uuid.UUID(bytes=bytes(value))


ID_TYPE = Uuid().with_variant(BinaryUUID(), *MYSQL_DIALECTS)
"""The ``id`` column's type: ``uuid`` on PostgreSQL, 32-char hex on SQLite, ``BINARY(16)`` on
MySQL and MariaDB (see :class:`BinaryUUID`)."""


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` with ``timezone.utc``; a naive value (SQLite's) is taken to be UTC already."""
    if value.tzinfo is dt.timezone.utc:
        return value  # the common case: nothing to do
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


_NAIVE_DIALECTS = ("sqlite", *MYSQL_DIALECTS)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """An aware-UTC ``datetime`` on every dialect.

    PostgreSQL's ``timestamptz`` already round-trips aware values; SQLite stores text and MySQL
    and MariaDB a ``DATETIME(6)``, and both give back naive ones. Values are converted to UTC on
    the way in (and sent without a zone where the column has none) and stamped UTC on the way
    out, so comparisons, the text SQLite sorts by and MySQL's wall-clock values agree. A naive
    value is refused rather than guessed: the outbox cannot know which zone it meant.

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

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        # MySQL's DATETIME keeps whole seconds unless told its fractional precision.
        if dialect.name in MYSQL_DIALECTS:
            return DATETIME(fsp=6)
        return self.impl_instance

    def coerce_compared_value(self, op: OperatorType | None, value: Any) -> TypeEngine[Any]:
        # A TypeDecorator's default binds every operand of an expression with the decorator
        # itself, so a timedelta would reach process_bind_param as if it were a datetime. Datetimes
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
        if dialect.name in _NAIVE_DIALECTS:
            # A zone-less column: send the UTC wall-clock time. A driver that passed the offset
            # on would have MySQL 8 convert it to the session's time zone, and MariaDB refuse it.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        return None if value is None else as_utc(value)
