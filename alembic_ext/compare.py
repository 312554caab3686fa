"""Autogenerate comparator: the outbox operations instead of the table spelled out.

Alembic's own table comparison already notices a missing outbox table; left alone it would write
``op.create_table('outbox', ...)`` with every column, plus ``op.create_index(...)`` for each
partial index (and an import of ``sqla_outbox.coltypes.UTCDateTime`` that it never writes) into
the application's migration history. This comparator runs *after* Alembic's table comparison and
rewrites those operations:

* a missing outbox becomes one ``op.create_outbox_table(version=N)``, N being the version of the
  outbox table in the target metadata (``outbox.SCHEMA_VERSION`` for ``outbox.metadata``),
  always written out, since a bare call means version 1;
* an outbox table in the database but no longer in the target metadata becomes one
  ``op.drop_outbox_table(version=N)`` (N: the database table's version), whose downgrade
  recreates exactly that version rather than a reflected approximation of it;
* an outbox table in the database at an older version than the target metadata's (Alembic would
  write ``add_column``/``create_index`` for the new version's columns and indexes, and
  ``create_table_comment``) becomes one ``op.upgrade_outbox_table(found, wanted)``, whose
  reverse (``downgrade()``) moves it back. Once the table is current, nothing is written.

Nothing else is touched: other tables' operations, and any other change Alembic finds on an
existing outbox table (a column an operator added, say), are left as Alembic wrote them, after
the upgrade operation. On an up-to-date outbox table Alembic 1.13+ reports no differences on
PostgreSQL and SQLite (types, server defaults, the partial indexes and the comment all compare
equal), so there is nothing to suppress there.

On MySQL and MariaDB two differences are only the database's way of writing what the version
defines, and are dropped: each index, which the database has on its
MySQL columns (:class:`sqla_outbox.versions.IndexSpec`) where the ``Index`` names PostgreSQL's
(Alembic would drop and recreate it), and ``parked``'s default ``false``, which MySQL reports as
``0``. An index with any other columns, or another default, is still reported.

A table is only treated as the outbox if it has one released version's exact layout (column
names in order, primary-key name, index names; see :func:`outbox_version`); an unrelated table
of yours named ``outbox`` is left to Alembic.

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

from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from alembic.autogenerate import comparators
from alembic.autogenerate.api import AutogenContext
from alembic.operations import ops
from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DefaultClause
from sqlalchemy.sql.elements import False_, True_

from alembic_ext.ops import CreateOutboxTableOp, DropOutboxTableOp, UpgradeOutboxTableOp
from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.versions import (
    STEPS,
    TABLE_NAME,
    VERSIONS,
    build_table,
    mysql_index_columns,
    version_from_comment,
)

try:  # Alembic >= 1.18: prioritised comparator chains
    from alembic.util import DispatchPriority, PriorityDispatchResult
except ImportError:  # pragma: no cover - Alembic 1.13 to 1.17
    _HAS_PRIORITIES = False
else:
    _HAS_PRIORITIES = True

__all__ = [
    "compare_outbox_table",
    "is_outbox_table",
    "outbox_version",
    "register_schema_comparator",
]

_SUBGROUP = "sqla_outbox"


@cache
def _canonical(version: int) -> Table:
    # Read only: compared against, never handed out.
    return build_table(version, MetaData())


def _index_names(table: Table) -> set[str]:
    return {str(index.name) for index in table.indexes if index.name is not None}


def _pk_name(table: Table) -> str | None:
    name = table.primary_key.name
    return None if name is None else str(name)


def _all_index_names() -> set[str]:
    return {name for step in STEPS.values() for name in step.index_names()}


def outbox_version(table: Table) -> int | None:
    """The outbox table version whose layout ``table`` has, or ``None`` if it is no outbox.

    The name, the columns in order, the primary key's name and the index names must all match
    that version (column types are Alembic's to compare). Copies made with
    ``Table.to_metadata(..., schema=...)`` match, so an app that places the outbox in its own
    schema still gets the outbox operations.
    """
    for version in reversed(VERSIONS):
        canonical = _canonical(version)
        if (
            table.name == canonical.name
            and [c.name for c in table.columns] == [c.name for c in canonical.columns]
            and _pk_name(table) == _pk_name(canonical)
            and _index_names(table) == _index_names(canonical)
        ):
            return version
    return None


def is_outbox_table(table: Table) -> bool:
    """Whether ``table`` is the library's outbox table, of any released version (or a
    schema-moved copy of one).

    The rewrite is only correct if ``op.create_outbox_table(version=N)`` would build the same
    table, so an application's unrelated table that merely happens to be called ``outbox`` is
    left alone (see :func:`outbox_version`).
    """
    return outbox_version(table) is not None


def _table_key(name: str, schema: str | None) -> str:
    return name if schema is None else f"{schema}.{name}"


def _normalise_schema(autogen_context: AutogenContext, schema: str | None) -> str | None:
    # Alembic names the default schema ``None`` in some operations and by name in others.
    return None if schema == autogen_context.dialect.default_schema_name else schema


def _metadata_table(autogen_context: AutogenContext, name: str, schema: str | None) -> Table | None:
    table_key_to_table = autogen_context.table_key_to_table
    table = table_key_to_table.get(_table_key(name, schema))
    if table is None and schema is not None:
        table = table_key_to_table.get(_table_key(name, _normalise_schema(autogen_context, schema)))
    return table


def _database_version(
    autogen_context: AutogenContext, schema: str | None, *, exact: bool
) -> int | None:
    """The version of the database's table ``outbox`` in ``schema``, if it has an outbox's shape.

    Version N's shape: all of N's columns and indexes, and none of the columns a later version
    adds. With ``exact`` (for a drop, whose reverse recreates the table) no other column either;
    without, columns of the application's own are allowed (they are Alembic's to compare). The
    comment, where the dialect keeps one, decides between versions that share their columns.
    """
    inspector = autogen_context.inspector
    if not inspector.has_table(TABLE_NAME, schema=schema):
        return None  # created by this migration: Alembic lists its indexes as a table change
    columns = {column["name"] for column in inspector.get_columns(TABLE_NAME, schema=schema)}
    indexes = {
        str(index["name"])
        for index in inspector.get_indexes(TABLE_NAME, schema=schema)
        if index["name"] is not None
    }
    ours = {name for step in STEPS.values() for name in step.column_names()}
    candidates = []
    for version in VERSIONS:
        expected = {column.name for column in _canonical(version).columns}
        extra = columns - expected
        if (
            expected <= columns
            and not (extra & ours)
            and not (exact and extra)
            and _index_names(_canonical(version)) <= indexes
        ):
            candidates.append(version)
    if not candidates:
        return None
    if autogen_context.dialect.supports_comments:
        comment = inspector.get_table_comment(TABLE_NAME, schema=schema)["text"]
        recorded = version_from_comment(comment)
        if recorded in candidates:
            return recorded
    return max(candidates)


def _strip_index_ops(
    autogen_context: AutogenContext,
    operations: Sequence[ops.MigrateOperation],
    schemas: set[str | None],
    index_op_type: type[ops.CreateIndexOp] | type[ops.DropIndexOp],
) -> list[ops.MigrateOperation]:
    """Drop the outbox's own index operations for tables in ``schemas``; keep everything else."""
    names = _all_index_names()
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


def _index_columns(op: ops.DropIndexOp) -> tuple[str, ...]:
    return tuple(str(column.name) for column in op.to_index().columns)


def _mysql_index_pairs(children: Sequence[ops.MigrateOperation], table: Table) -> set[str]:
    """Names of the outbox indexes Alembic would drop and recreate only because the database
    has them on their MySQL columns: dropped with exactly those, recreated with the ``Index``'s."""
    indexes = {str(index.name): index for index in table.indexes}
    dropped, created = set(), set()
    for child in children:
        if isinstance(child, ops.DropIndexOp):
            index = indexes.get(child.index_name)
            mysql = None if index is None else mysql_index_columns(index)
            if mysql is not None and _index_columns(child) == mysql:
                dropped.add(child.index_name)
        elif isinstance(child, ops.CreateIndexOp) and child.index_name in indexes:
            index = indexes[str(child.index_name)]
            if mysql_index_columns(index) is not None:
                created.add(str(child.index_name))
    return dropped & created


def _boolean_default_as_integer(child: ops.MigrateOperation) -> bool:
    """Alembic's change of a ``false()``/``true()`` default that MySQL reports as ``0``/``1``."""
    if not isinstance(child, ops.AlterColumnOp) or (
        child.modify_nullable is not None
        or child.modify_type is not None
        or child.modify_name is not None
        or child.modify_comment is not False
    ):
        return False
    wanted, found = child.modify_server_default, child.existing_server_default
    if not isinstance(wanted, DefaultClause) or not isinstance(wanted.arg, (False_, True_)):
        return False
    reported = getattr(getattr(found, "arg", None), "text", found)
    return str(reported).strip("'") == ("1" if isinstance(wanted.arg, True_) else "0")


def _mysql_spellings(autogen_context: AutogenContext, op: ops.ModifyTableOps) -> set[int]:
    """Those of ``op``'s operations (Alembic's changes to an outbox table) that are only MySQL's or
    MariaDB's way of writing what the table version defines (see the module docs); none on
    other databases, or for a table that is not the outbox. By ``id()``: operations have no
    equality of their own."""
    if autogen_context.dialect.name not in MYSQL_DIALECTS:
        return set()
    table = _metadata_table(autogen_context, op.table_name, op.schema)
    if table is None or outbox_version(table) is None:
        return set()
    pairs = _mysql_index_pairs(op.ops, table)
    return {
        id(child)
        for child in op.ops
        if (isinstance(child, (ops.CreateIndexOp, ops.DropIndexOp)) and child.index_name in pairs)
        or _boolean_default_as_integer(child)
    }


def _covered_by_move(child: ops.MigrateOperation, move: UpgradeOutboxTableOp) -> bool:
    """Whether Alembic's ``child`` operation is part of what ``move`` does."""
    changed = [STEPS[max(old, new)] for old, new in move.steps()]
    columns = {name for step in changed for name in step.column_names()}
    indexes = {name for step in changed for name in step.index_names()}
    if isinstance(child, ops.AddColumnOp):
        return child.column.name in columns
    if isinstance(child, ops.DropColumnOp):
        return child.column_name in columns
    if isinstance(child, (ops.CreateIndexOp, ops.DropIndexOp)):
        return child.index_name in indexes
    # The table comment records the version; the move sets it.
    return isinstance(child, (ops.CreateTableCommentOp, ops.DropTableCommentOp))


def _move(autogen_context: AutogenContext, op: ops.ModifyTableOps) -> UpgradeOutboxTableOp | None:
    """The move between versions that Alembic's changes to an outbox table stand for, if any."""
    table = _metadata_table(autogen_context, op.table_name, op.schema)
    wanted = None if table is None else outbox_version(table)
    if wanted is None:
        return None
    found = _database_version(autogen_context, op.schema, exact=False)
    if found is None or found == wanted:
        return None
    return UpgradeOutboxTableOp(found, wanted, schema=op.schema)


def _rewrite(autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps) -> None:
    created: set[str | None] = set()
    dropped: set[str | None] = set()
    rewritten: list[ops.MigrateOperation] = []
    for op in upgrade_ops.ops:
        if isinstance(op, ops.CreateTableOp) and op.table_name == TABLE_NAME:
            table = _metadata_table(autogen_context, op.table_name, op.schema)
            version = None if table is None else outbox_version(table)
            if version is not None:
                rewritten.append(CreateOutboxTableOp(version=version, schema=op.schema))
                created.add(_normalise_schema(autogen_context, op.schema))
                continue
        if isinstance(op, ops.DropTableOp) and op.table_name == TABLE_NAME:
            version = _database_version(autogen_context, op.schema, exact=True)
            if version is not None:
                rewritten.append(DropOutboxTableOp(version=version, schema=op.schema))
                dropped.add(_normalise_schema(autogen_context, op.schema))
                continue
        if isinstance(op, ops.ModifyTableOps) and op.table_name == TABLE_NAME:
            spelling = _mysql_spellings(autogen_context, op)
            if spelling:
                op.ops = [child for child in op.ops if id(child) not in spelling]
                if op.is_empty():
                    continue
            move = _move(autogen_context, op)
            if move is not None:
                rewritten.append(move)
                op.ops = [child for child in op.ops if not _covered_by_move(child, move)]
                if op.is_empty():
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
) -> None:
    """Schema-level comparator: rewrite the outbox's raw table operations into the custom ops.

    Runs once per autogenerate pass after Alembic's table comparison, so ``upgrade_ops`` already
    holds every ``CreateTableOp``/``DropTableOp`` Alembic decided on; ``schemas`` is unused
    because those operations carry their own schema.
    """
    _rewrite(autogen_context, upgrade_ops)


Comparator = Callable[[AutogenContext, ops.UpgradeOps, Iterable[str | None]], None]


def register_schema_comparator(comparator: Comparator, subgroup: str) -> None:
    """Register ``comparator`` in Alembic's global registry at the ``"schema"`` level (see the
    module docs), to run after Alembic's own table comparison. On Alembic 1.18+ it runs at
    ``DispatchPriority.LAST`` in ``subgroup`` and answers ``PriorityDispatchResult.CONTINUE``,
    so no other comparator is skipped; before 1.18 the return value is ignored."""
    if not _HAS_PRIORITIES:  # pragma: no cover - Alembic 1.13 to 1.17
        comparators.dispatch_for("schema")(comparator)
        return

    def continuing(
        autogen_context: AutogenContext,
        upgrade_ops: ops.UpgradeOps,
        schemas: Iterable[str | None],
    ) -> Any:
        comparator(autogen_context, upgrade_ops, schemas)
        return PriorityDispatchResult.CONTINUE

    comparators.dispatch_for("schema", priority=DispatchPriority.LAST, subgroup=subgroup)(
        continuing
    )


register_schema_comparator(compare_outbox_table, _SUBGROUP)
