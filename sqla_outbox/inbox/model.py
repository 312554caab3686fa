"""The inbox table, ``outbox_inbox``: one row per message a consumer has processed.

Its primary key, ``(consumer, key)``, is what makes processing effectively once: the row is
inserted in the transaction that does the consumer's work, so the key is recorded if and only
if the work committed, and a second insert of the same key waits for the first transaction and
then finds it (see :mod:`sqla_outbox.inbox.receiving`). ``received_at`` dates the row for
retention (:func:`sqla_outbox.inbox.purge`, through ``ix_outbox_inbox_received``).

Its own ``MetaData`` and its own schema version (:data:`SCHEMA_VERSION`, recorded in the table
comment where the database keeps one), with the outbox table's discipline: a released version
is frozen; a change is a new version.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Index, MetaData, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_outbox.coltypes import UTCDateTime
from sqla_outbox.validation import MAX_TEXT_LENGTH

__all__ = ["KEY_LENGTH", "SCHEMA_VERSION", "TABLE_NAME", "InboxRow", "inbox_table", "metadata"]

SCHEMA_VERSION = 1
"""The inbox table version this sqla-outbox reads and writes."""
TABLE_NAME = "outbox_inbox"
KEY_LENGTH = MAX_TEXT_LENGTH
"""Characters in ``consumer`` and ``key``: as many as the outbox's ``idempotency_key``."""

metadata = MetaData()
"""The ``MetaData`` holding the inbox table and nothing else."""


class _Base(DeclarativeBase):
    metadata = metadata


class InboxRow(_Base):
    """A message ``consumer`` has processed, by its idempotency ``key``, and when."""

    __tablename__ = TABLE_NAME
    __table_args__ = (
        Index("ix_outbox_inbox_received", "received_at"),
        {"comment": f"sqla-outbox inbox schema {SCHEMA_VERSION}"},
    )

    consumer: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    key: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), nullable=False)


inbox_table: Table = metadata.tables[TABLE_NAME]
"""The inbox ``Table``, for Core statements."""
