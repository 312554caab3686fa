"""``op.create_outbox_table()`` / ``op.drop_outbox_table()``: the outbox table in one step.

A migration that spelled the outbox out column by column would freeze today's definition into the
application's history and drift from :mod:`sqla_outbox.model` the day either side changes. These
operations build the table from the library's own ``MetaData`` when the migration runs, so the
migration says *what* it wants (the outbox, in this schema) and the library says *how*.

Both operations go through ``operations.impl`` rather than a live connection, so they work in
online migrations, in offline ``alembic upgrade --sql`` mode, and on every dialect Alembic supports.
"""

from __future__ import annotations

from typing import Any

from alembic.operations import MigrateOperation, Operations
from sqlalchemy import Index, MetaData, Table
from sqlalchemy.schema import DDL

from sqla_outbox import ddl
from sqla_outbox.model import TABLE_NAME
from sqla_outbox.model import metadata as outbox_metadata

__all__ = ["CreateOutboxTableOp", "DropOutboxTableOp", "outbox_table"]


def outbox_table(schema: str | None = None) -> Table:
    """A fresh copy of the outbox ``Table`` (with its indexes) placed in ``schema``.

    A copy on a private ``MetaData`` rather than the library's table itself: the operations must
    be able to put the table in any schema without mutating :data:`sqla_outbox.metadata`, which
    the running application shares.
    """
    source = outbox_metadata.tables[TABLE_NAME]
    if schema is None:
        # The model declares no schema; keeping it means "the connection's default schema".
        return source.to_metadata(MetaData())
    return source.to_metadata(MetaData(), schema=schema)


def _indexes_by_name(table: Table) -> list[Index]:
    # A stable order, so offline SQL and logs read the same on every run.
    return sorted(table.indexes, key=lambda index: str(index.name))


@Operations.register_operation("create_outbox_table")
class CreateOutboxTableOp(MigrateOperation):
    """Create the outbox table and its indexes, exactly as :mod:`sqla_outbox.model` defines them.

    One operation instead of ``create_table`` + ``create_index`` so autogenerate (see
    :mod:`alembic_ext.compare`) can write a single readable line, and so that the table, its
    partial index, its storage options and its column types always come from one source of truth.
    """

    def __init__(self, *, schema: str | None = None) -> None:
        self.schema = schema

    @classmethod
    def create_outbox_table(cls, operations: Operations, *, schema: str | None = None) -> None:
        """Create the outbox table (and ``ix_outbox_unpublished``) in ``schema``.

        ``schema=None`` means the connection's default schema, as everywhere in Alembic. The
        schema must already exist: creating schemas is the application's business.
        """
        operations.invoke(cls(schema=schema))

    def reverse(self) -> DropOutboxTableOp:
        """The matching drop, so autogenerate writes the downgrade for free."""
        return DropOutboxTableOp(schema=self.schema)

    def to_table(self) -> Table:
        """The table this operation creates, as a ``Table`` in its own ``MetaData``."""
        return outbox_table(self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("add_table", table)``, so ``compare_metadata`` and ``alembic check`` can report it."""
        return ("add_table", self.to_table())

    def __repr__(self) -> str:
        return f"CreateOutboxTableOp(schema={self.schema!r})"


@Operations.register_operation("drop_outbox_table")
class DropOutboxTableOp(MigrateOperation):
    """Drop the outbox's indexes, then the table: the inverse of :class:`CreateOutboxTableOp`.

    The indexes are dropped explicitly (most databases would drop them with the table) so the
    operation is symmetric in offline SQL scripts and on backends that keep orphaned indexes.
    """

    def __init__(self, *, schema: str | None = None) -> None:
        self.schema = schema

    @classmethod
    def drop_outbox_table(cls, operations: Operations, *, schema: str | None = None) -> None:
        """Drop the outbox table and its indexes from ``schema``.

        Any rows still in the outbox are lost, published or not; drain the relay first.
        """
        operations.invoke(cls(schema=schema))

    def reverse(self) -> CreateOutboxTableOp:
        """The matching create, so a downgrade of a drop restores the canonical table."""
        return CreateOutboxTableOp(schema=self.schema)

    def to_table(self) -> Table:
        """The table this operation drops, as a ``Table`` in its own ``MetaData``."""
        return outbox_table(self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("remove_table", table)``, mirroring Alembic's own ``DropTableOp``."""
        return ("remove_table", self.to_table())

    def __repr__(self) -> str:
        return f"DropOutboxTableOp(schema={self.schema!r})"


@Operations.implementation_for(CreateOutboxTableOp)
def create_outbox_table(operations: Operations, operation: CreateOutboxTableOp) -> None:
    """Emit ``CREATE TABLE`` and ``CREATE INDEX`` through the migration's DDL implementation.

    ``impl.create_table`` creates the table's indexes too (it has done so in every Alembic release
    this package supports), so no separate ``create_index`` call is made: one would create
    ``ix_outbox_unpublished`` twice.
    """
    table = operation.to_table()
    operations.impl.create_table(table)
    # The table copy has none of the model's after_create listeners: fillfactor and the
    # notification trigger on PostgreSQL (see sqla_outbox.ddl).
    _run_postgresql_ddl(operations, ddl.after_create(table))


@Operations.implementation_for(DropOutboxTableOp)
def drop_outbox_table(operations: Operations, operation: DropOutboxTableOp) -> None:
    """Emit ``DROP INDEX`` for each outbox index, then ``DROP TABLE``."""
    table = operation.to_table()
    for index in _indexes_by_name(table):
        operations.impl.drop_index(index)
    operations.impl.drop_table(table)
    _run_postgresql_ddl(operations, ddl.after_drop(table))


def _run_postgresql_ddl(operations: Operations, statements: list[DDL]) -> None:
    if operations.impl.dialect.name == "postgresql":
        for statement in statements:
            operations.execute(statement)
