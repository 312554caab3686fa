"""The example application's own models: one business table, ``orders``.

It lives on its own ``MetaData``; ``env.py`` hands Alembic ``[app_metadata, outbox.metadata]`` so
autogenerate sees the business tables and the outbox together, as a real app would.
"""

from __future__ import annotations

from sqlalchemy import MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

app_metadata = MetaData()
"""The application's tables (the outbox is not here: it is on ``sqla_outbox.metadata``)."""


class Base(DeclarativeBase):
    """Declarative base bound to :data:`app_metadata`."""

    metadata = app_metadata


class Order(Base):
    """An order; placing one would ``outbox.enqueue(...)`` a job in the same transaction."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(255))
    total_cents: Mapped[int]
