"""The outbox table: ``OutboxRow`` mapped on the library's own ``metadata``.

The table lives on its own ``MetaData`` so an application adds it to Alembic's
``target_metadata`` list (or calls ``outbox.metadata.create_all(engine)`` in tests) without the
library reaching into the application's models. Constraint and index names are explicit so a
migration written today drops cleanly tomorrow, whatever naming convention the app uses.

The table is not declared here: ``OutboxRow`` maps table version :data:`SCHEMA_VERSION`, built
from its frozen definition in :mod:`sqla_outbox.versions` (where every released version, and
what each one added, is written down once). To change the table, add a version there; the
annotations below only give the mapped attributes their Python types.

One schema serves PostgreSQL, SQLite, MySQL and MariaDB and hands back the same Python types on
all of them: ``id`` is a ``uuid.UUID`` (native ``uuid`` / 32-char hex / ``BINARY(16)``),
``input`` is JSON (``jsonb`` on PostgreSQL), and every timestamp is an aware UTC ``datetime``
(``timestamptz`` / ISO text / ``DATETIME(6)`` normalised to UTC; see
:mod:`sqla_outbox.coltypes`). On MySQL and MariaDB the partial indexes below are composite ones
led by their predicate's columns (:class:`~sqla_outbox.versions.IndexSpec`).

Claim order is ``(staged_at, id)``: see :mod:`sqla_outbox.ids` for why ``id`` breaks ties. The
indexes are partial (``ix_outbox_unpublished``, and from version 2 ``ix_outbox_claimable`` and
the ordering-key, failing and parked ones): each the claim uses covers only rows that are still
unpublished or parked, so the claim's cost follows the backlog, not the history of everything
ever published. That history is :func:`sqla_outbox.purge`'s: version 3's ``ix_outbox_published``
covers only the published rows, by ``published_at``, so a purge finds the oldest of them without
reading the rest. Relays never read it; each mark adds one entry to it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, ClassVar

from sqlalchemy import FromClause, MetaData
from sqlalchemy.orm import DeclarativeBase, Mapped

from sqla_outbox.coltypes import UTCDateTime, as_utc
from sqla_outbox.versions import SCHEMA_VERSION, TABLE_NAME, build_table

__all__ = ["SCHEMA_VERSION", "TABLE_NAME", "OutboxRow", "UTCDateTime", "as_utc", "metadata"]

metadata = MetaData()
"""The ``MetaData`` holding the outbox table and nothing else."""


class _Base(DeclarativeBase):
    metadata = metadata


class OutboxRow(_Base):
    """One staged job: written in the business transaction, published by a relay after commit.

    ``claimed_by``/``claimed_at`` are the relay's lease: ``claimed_by`` is a fence token unique to
    one claim, and every update a relay makes after claiming is conditioned on it, so a relay that
    stalled past its lease cannot release or retire rows another relay now holds.
    ``attempts``/``last_error`` record failed publishes for operators; they never reorder rows.
    ``ordering_key``, ``retry_at``, ``dead_at`` and ``parked`` (schema version 2) carry per-key
    ordering, per-row retry backoff and dead letters.
    """

    # Typed as DeclarativeBase types it (a FromClause), as every mapped class's __table__ is.
    __table__: ClassVar[FromClause] = build_table(SCHEMA_VERSION, metadata)

    # Types only: the columns come from __table__ (sqla_outbox.versions).
    id: Mapped[uuid.UUID]
    job: Mapped[str]
    queue: Mapped[str]
    input: Mapped[Any]
    idempotency_key: Mapped[str]
    max_attempts: Mapped[int]
    run_at: Mapped[dt.datetime]
    staged_at: Mapped[dt.datetime]
    tenant_id: Mapped[str | None]
    traceparent: Mapped[str | None]
    enqueued_by: Mapped[str | None]
    claimed_by: Mapped[str | None]
    claimed_at: Mapped[dt.datetime | None]
    published_at: Mapped[dt.datetime | None]
    attempts: Mapped[int]
    last_error: Mapped[str | None]
    ordering_key: Mapped[str | None]
    retry_at: Mapped[dt.datetime | None]
    dead_at: Mapped[dt.datetime | None]
    parked: Mapped[bool]
    wake_at: Mapped[dt.datetime | None]
    parked_behind: Mapped[uuid.UUID | None]

    def __repr__(self) -> str:
        return f"<OutboxRow id={self.id} job={self.job!r} queue={self.queue!r}>"
