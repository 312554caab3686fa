"""The outbox table: ``OutboxRow`` mapped on the library's own ``metadata``.

The table lives on its own ``MetaData`` so an application adds it to Alembic's
``target_metadata`` list (or calls ``outbox.metadata.create_all(engine)`` in tests) without the
library reaching into the application's models. Constraint and index names are explicit so a
migration written today drops cleanly tomorrow, whatever naming convention the app uses.

One schema serves PostgreSQL and SQLite and hands back the same Python types on both: ``id`` is
a ``uuid.UUID`` (native ``uuid`` / 32-char hex), ``input`` is JSON (``jsonb`` on PostgreSQL), and
every timestamp is an aware UTC ``datetime`` (``timestamptz`` / ISO text normalised to UTC).

Claim order is ``(staged_at, id)``: see :mod:`sqla_outbox.ids` for why ``id`` breaks ties. The
partial index ``ix_outbox_unpublished`` covers exactly the rows a relay can still claim, so the
claim's cost follows the backlog, not the history of everything ever published.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Text,
    TypeDecorator,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.operators import OperatorType
from sqlalchemy.types import TypeEngine

__all__ = ["TABLE_NAME", "OutboxRow", "UTCDateTime", "as_utc", "metadata"]

#: The outbox table's name; every statement reaches it through ``OutboxRow.__table__``.
TABLE_NAME = "outbox"

metadata = MetaData()
"""The ``MetaData`` holding the outbox table and nothing else."""


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


_JSON = JSON().with_variant(JSONB(), "postgresql")


class _Base(DeclarativeBase):
    metadata = metadata


class OutboxRow(_Base):
    """One staged job: written in the business transaction, published by a relay after commit.

    ``claimed_by``/``claimed_at`` are the relay's lease: ``claimed_by`` is a fence token unique to
    one claim, and every update a relay makes after claiming is conditioned on it, so a relay that
    stalled past its lease cannot release or retire rows another relay now holds.
    ``attempts``/``last_error`` record failed publishes for operators; they never reorder rows.
    """

    __tablename__ = TABLE_NAME
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_outbox"),
        Index(
            "ix_outbox_unpublished",
            "staged_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
            sqlite_where=text("published_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid(), primary_key=True)
    job: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255), server_default="default")
    input: Mapped[Any] = mapped_column(_JSON)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    staged_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(255))
    traceparent: Mapped[str | None] = mapped_column(String(55))
    enqueued_by: Mapped[str | None] = mapped_column(String(255))
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    published_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"<OutboxRow id={self.id} job={self.job!r} queue={self.queue!r}>"
