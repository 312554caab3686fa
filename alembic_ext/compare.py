"""Autogenerate comparator: write ``op.create_outbox_table()`` instead of the table spelled out.

Alembic's own table comparison already notices a missing outbox table; left alone it would write
``op.create_table('outbox', ...)`` with every column, plus ``op.create_index(...)`` for the partial
index, freezing today's definition (and an import of ``sqla_outbox.model.UTCDateTime``) into the
application's migration history. This comparator runs *after* Alembic's table comparison and
rewrites exactly those operations into one :class:`~alembic_ext.ops.CreateOutboxTableOp`. In the
other direction, an outbox table that is in the database but no longer in the target metadata
becomes one :class:`~alembic_ext.ops.DropOutboxTableOp`, whose downgrade recreates the canonical
table rather than a reflected approximation of it.

Nothing else is touched: other tables' operations, and any change Alembic finds on an *existing*
outbox table (a column an operator added, say), are left as Alembic wrote them. On an up-to-date
outbox table Alembic 1.13+ reports no differences (types, server defaults and the partial index
all compare equal on PostgreSQL and SQLite), so there is nothing to suppress.

Registration
------------
The comparator is registered, when :mod:`alembic_ext` is imported, in Alembic's *global*
comparator registry (``alembic.autogenerate.comparators``) at the ``"schema"`` level. Since
Alembic 1.18 every ``AutogenContext`` starts from a copy of that registry before adding the
plugins named in ``autogenerate_plugins``, so global comparators run with no configuration at all;
this is the registration Alembic documents for extensions that must work without being named in
``env.py``. On 1.18+ it is registered with ``DispatchPriority.LAST`` so it runs after the built-in
``alembic.autogenerate.tables`` plugin (``MEDIUM``) has produced the operations it rewrites; before
1.18 the built-in comparators are registered when Alembic is imported, so a comparator added later
already runs after them.

A :class:`alembic.runtime.plugins.Plugin` (``alembic.plugins`` entry point) is deliberately *not*
used: Alembic only runs a plugin's comparators when its name is listed in ``autogenerate_plugins``,
which would break the zero-configuration promise and silently produce raw ``create_table`` calls
for anyone who forgot the setting. Nor can an entry point stand in for ``import alembic_ext``:
Alembic (1.18 to 1.20 at least) loads entry points while ``alembic.autogenerate`` is still being
imported, before this global registry exists, so importing this module from one fails, and a
tolerant import would leave the comparator unregistered for good (a later ``import alembic_ext``
finds the module already imported).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from alembic.autogenerate import comparators
from alembic.autogenerate.api import AutogenContext
from alembic.operations import ops
from sqlalchemy import Table

from alembic_ext.ops import CreateOutboxTableOp, DropOutboxTableOp
from sqla_outbox.model import TABLE_NAME
from sqla_outbox.model import metadata as outbox_metadata

try:  # Alembic >= 1.18: prioritised comparator chains
    from alembic.util import DispatchPriority, PriorityDispatchResult
except ImportError:  # pragma: no cover - Alembic 1.13 to 1.17
    _HAS_PRIORITIES = False
else:
    _HAS_PRIORITIES = True

__all__ = ["compare_outbox_table", "is_outbox_table"]

_SUBGROUP = "sqla_outbox"


def _canonical() -> Table:
    return outbox_metadata.tables[TABLE_NAME]


def _index_names(table: Table) -> set[str]:
    return {str(index.name) for index in table.indexes if index.name is not None}


def _pk_name(table: Table) -> str | None:
    name = table.primary_key.name
    return None if name is None else str(name)


def is_outbox_table(table: Table) -> bool:
    """Whether ``table`` is the library's outbox table (or a schema-moved copy of it).

    The rewrite is only correct if ``op.create_outbox_table()`` would build the same table, so an
    application's unrelated table that merely happens to be called ``outbox`` is left alone: the
    name, the columns in order, the primary key's name and the index names must all match.
    Copies made with ``Table.to_metadata(..., schema=...)`` match, so an app that places the outbox
    in its own schema still gets ``op.create_outbox_table(schema=...)``.
    """
    canonical = _canonical()
    if table is canonical:
        return True
    return (
        table.name == canonical.name
        and [c.name for c in table.columns] == [c.name for c in canonical.columns]
        and _pk_name(table) == _pk_name(canonical)
        and _index_names(table) == _index_names(canonical)
    )


def _table_key(name: str, schema: str | None) -> str:
    return name if schema is None else f"{schema}.{name}"


def _normalise_schema(autogen_context: AutogenContext, schema: str | None) -> str | None:
    # Alembic names the default schema ``None`` in some operations and by name in others.
    return None if schema == autogen_context.dialect.default_schema_name else schema


def _metadata_table(autogen_context: AutogenContext, op: ops.CreateTableOp) -> Table | None:
    return autogen_context.table_key_to_table.get(_table_key(op.table_name, op.schema))


def _database_table_is_outbox(autogen_context: AutogenContext, schema: str | None) -> bool:
    """Whether the table ``outbox`` in ``schema`` of the database has the outbox's shape."""
    inspector = autogen_context.inspector
    canonical = _canonical()
    columns = [column["name"] for column in inspector.get_columns(TABLE_NAME, schema=schema)]
    indexes = {
        str(index["name"])
        for index in inspector.get_indexes(TABLE_NAME, schema=schema)
        if index["name"] is not None
    }
    expected_columns = {column.name for column in canonical.columns}
    return set(columns) == expected_columns and _index_names(canonical) <= indexes


def _strip_index_ops(
    autogen_context: AutogenContext,
    operations: Sequence[ops.MigrateOperation],
    schemas: set[str | None],
    index_op_type: type[ops.CreateIndexOp] | type[ops.DropIndexOp],
) -> list[ops.MigrateOperation]:
    """Drop the outbox's own index operations for tables in ``schemas``; keep everything else."""
    names = _index_names(_canonical())
    result: list[ops.MigrateOperation] = []
    for op in operations:
        if (
            isinstance(op, ops.ModifyTableOps)
            and op.table_name == TABLE_NAME
            and _normalise_schema(autogen_context, op.schema) in schemas
        ):
            op.ops = [
                child
                for child in op.ops
                if not (isinstance(child, index_op_type) and child.index_name in names)
            ]
            if op.is_empty():
                continue
        result.append(op)
    return result


def _rewrite(autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps) -> None:
    created: set[str | None] = set()
    dropped: set[str | None] = set()
    rewritten: list[ops.MigrateOperation] = []
    for op in upgrade_ops.ops:
        if isinstance(op, ops.CreateTableOp) and op.table_name == TABLE_NAME:
            table = _metadata_table(autogen_context, op)
            if table is not None and is_outbox_table(table):
                rewritten.append(CreateOutboxTableOp(schema=op.schema))
                created.add(_normalise_schema(autogen_context, op.schema))
                continue
        if (
            isinstance(op, ops.DropTableOp)
            and op.table_name == TABLE_NAME
            and _database_table_is_outbox(autogen_context, op.schema)
        ):
            rewritten.append(DropOutboxTableOp(schema=op.schema))
            dropped.add(_normalise_schema(autogen_context, op.schema))
            continue
        rewritten.append(op)
    if created:
        rewritten = _strip_index_ops(autogen_context, rewritten, created, ops.CreateIndexOp)
    if dropped:
        rewritten = _strip_index_ops(autogen_context, rewritten, dropped, ops.DropIndexOp)
    upgrade_ops.ops = rewritten


def compare_outbox_table(
    autogen_context: AutogenContext,
    upgrade_ops: ops.UpgradeOps,
    schemas: Iterable[str | None],
) -> Any:
    """Schema-level comparator: rewrite the outbox's raw table operations into the custom ops.

    Runs once per autogenerate pass after Alembic's table comparison, so ``upgrade_ops`` already
    holds every ``CreateTableOp``/``DropTableOp`` Alembic decided on; ``schemas`` is unused
    because those operations carry their own schema. Returns ``PriorityDispatchResult.CONTINUE``
    on Alembic 1.18+ (``None`` before, where the return value is ignored) so no other comparator
    is skipped.
    """
    _rewrite(autogen_context, upgrade_ops)
    return PriorityDispatchResult.CONTINUE if _HAS_PRIORITIES else None


def _register() -> None:
    if _HAS_PRIORITIES:
        comparators.dispatch_for("schema", priority=DispatchPriority.LAST, subgroup=_SUBGROUP)(
            compare_outbox_table
        )
    else:  # pragma: no cover - Alembic 1.13 to 1.17
        comparators.dispatch_for("schema")(compare_outbox_table)


_register()
