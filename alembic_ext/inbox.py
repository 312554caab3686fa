"""Alembic support for the inbox table (:mod:`sqla_outbox.inbox`): its operations and
autogenerate.

* ``op.create_inbox_table(version=N, schema=None)`` creates inbox table version N exactly, with
  its retention index; a released version is frozen, as the outbox's are. Version 1 is the only
  one so far.
* ``op.drop_inbox_table(schema=None)`` drops the index, then the table.
* Autogenerate: a missing inbox table (``inbox.metadata`` in ``target_metadata``) is written as
  one ``op.create_inbox_table(version=1)`` rather than ``create_table`` and ``create_index``
  spelled out, and an inbox table no longer in the metadata as ``op.drop_inbox_table()``. A
  table named ``outbox_inbox`` with another layout is left to Alembic.

Registered, with the outbox's, by ``import alembic_ext``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation, Operations, ops
from sqlalchemy import MetaData, Table

from alembic_ext.compare import register_schema_comparator
from alembic_ext.render import render_call, schema_argument
from sqla_outbox.errors import ConfigurationError
from sqla_outbox.inbox.model import SCHEMA_VERSION, TABLE_NAME, inbox_table

__all__ = ["CreateInboxTableOp", "DropInboxTableOp", "compare_inbox_table", "inbox_table_at"]

_INDEXES = frozenset(str(index.name) for index in inbox_table.indexes)


def inbox_table_at(version: int, schema: str | None = None) -> Table:
    """Inbox table ``version`` in ``schema``, as a ``Table`` of a ``MetaData`` of its own."""
    if version != 1:
        raise ConfigurationError(
            f"inbox table version {version!r} does not exist: this sqla-outbox knows version 1 "
            f"(inbox.SCHEMA_VERSION is {SCHEMA_VERSION}). Pass version=1."
        )
    copy = MetaData(schema=schema)
    return inbox_table.to_metadata(copy)


@Operations.register_operation("create_inbox_table")
class CreateInboxTableOp(MigrateOperation):
    """Create inbox table ``version`` and its index, exactly as that version is defined."""

    def __init__(self, *, version: int = 1, schema: str | None = None) -> None:
        inbox_table_at(version)  # refuses an unknown version when the migration is written
        self.version = version
        self.schema = schema

    @classmethod
    def create_inbox_table(
        cls, operations: Operations, *, version: int = 1, schema: str | None = None
    ) -> None:
        """Create inbox table ``version`` in ``schema`` (``None``: the default schema)."""
        operations.invoke(cls(version=version, schema=schema))

    def reverse(self) -> DropInboxTableOp:
        return DropInboxTableOp(schema=self.schema, version=self.version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_table", inbox_table_at(self.version, self.schema))


@Operations.register_operation("drop_inbox_table")
class DropInboxTableOp(MigrateOperation):
    """Drop the inbox's index, then the table: the inverse of :class:`CreateInboxTableOp`."""

    def __init__(self, *, schema: str | None = None, version: int = 1) -> None:
        self.schema = schema
        self.version = version

    @classmethod
    def drop_inbox_table(cls, operations: Operations, *, schema: str | None = None) -> None:
        """Drop the inbox table from ``schema``."""
        operations.invoke(cls(schema=schema))

    def reverse(self) -> CreateInboxTableOp:
        return CreateInboxTableOp(version=self.version, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_table", inbox_table_at(self.version, self.schema))


@Operations.implementation_for(CreateInboxTableOp)
def create_inbox_table(operations: Operations, operation: CreateInboxTableOp) -> None:
    """``CREATE TABLE`` with its index and comment (``impl.create_table`` creates both)."""
    operations.impl.create_table(inbox_table_at(operation.version, operation.schema))


@Operations.implementation_for(DropInboxTableOp)
def drop_inbox_table(operations: Operations, operation: DropInboxTableOp) -> None:
    """``DROP INDEX``, then ``DROP TABLE``."""
    table = inbox_table_at(operation.version, operation.schema)
    for index in sorted(table.indexes, key=lambda index: str(index.name)):
        operations.impl.drop_index(index)
    operations.impl.drop_table(table)


@renderers.dispatch_for(CreateInboxTableOp)
def render_create_inbox_table(autogen_context: AutogenContext, op: CreateInboxTableOp) -> str:
    """``op.create_inbox_table(version=N)``: the version always written out."""
    return render_call(
        autogen_context, "create_inbox_table", f"version={op.version!r}", schema_argument(op.schema)
    )


@renderers.dispatch_for(DropInboxTableOp)
def render_drop_inbox_table(autogen_context: AutogenContext, op: DropInboxTableOp) -> str:
    """``op.drop_inbox_table()`` (``schema=...`` only when one is set)."""
    return render_call(autogen_context, "drop_inbox_table", schema_argument(op.schema))


def _is_inbox(table: Table | None) -> bool:
    """Whether ``table`` has the inbox's layout (its columns, in order): version 1's."""
    return table is not None and [c.name for c in table.columns] == [
        c.name for c in inbox_table.columns
    ]


def _without_index_ops(
    operations: Sequence[ops.MigrateOperation], schemas: set[str | None]
) -> list[ops.MigrateOperation]:
    kept: list[ops.MigrateOperation] = []
    for op in operations:
        if isinstance(op, (ops.CreateIndexOp, ops.DropIndexOp)) and (
            op.table_name == TABLE_NAME and op.schema in schemas and op.index_name in _INDEXES
        ):
            continue
        if (
            isinstance(op, ops.ModifyTableOps)
            and op.table_name == TABLE_NAME
            and op.schema in schemas
        ):
            op.ops = [
                child
                for child in op.ops
                if not (
                    isinstance(child, (ops.CreateIndexOp, ops.DropIndexOp))
                    and child.index_name in _INDEXES
                )
            ]
            if op.is_empty():
                continue
        kept.append(op)
    return kept


def compare_inbox_table(
    autogen_context: AutogenContext,
    upgrade_ops: ops.UpgradeOps,
    schemas: Iterable[str | None],
) -> None:
    """Schema-level comparator: the inbox's raw ``create_table``/``drop_table`` (and its index
    operations) become :class:`CreateInboxTableOp`/:class:`DropInboxTableOp`."""
    touched: set[str | None] = set()
    rewritten: list[ops.MigrateOperation] = []
    for op in upgrade_ops.ops:
        ours = getattr(op, "table_name", None) == TABLE_NAME
        if isinstance(op, ops.CreateTableOp) and ours and _is_inbox(op.to_table()):
            rewritten.append(CreateInboxTableOp(version=SCHEMA_VERSION, schema=op.schema))
            touched.add(op.schema)
            continue
        if isinstance(op, ops.DropTableOp) and ours and _is_inbox(op.to_table()):
            rewritten.append(DropInboxTableOp(schema=op.schema))
            touched.add(op.schema)
            continue
        rewritten.append(op)
    upgrade_ops.ops = _without_index_ops(rewritten, touched) if touched else rewritten


register_schema_comparator(compare_inbox_table, "sqla_outbox_inbox")
