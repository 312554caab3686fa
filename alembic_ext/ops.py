"""The outbox operations: create, drop, and move a table between schema versions.

* ``op.create_outbox_table(version=N, schema=None)`` creates table version N exactly as
  :mod:`sqla_outbox.versions` defines it. A version is frozen once released, so the migration
  means the same table forever; a bare ``op.create_outbox_table()`` means version 1, the table
  released first, so migrations written before versions existed keep their meaning.
* ``op.drop_outbox_table(version=N, schema=None)`` drops it; ``version`` only says what its
  reverse (the downgrade) recreates and which indexes to drop. Bare, it means version 1 too.
* ``op.upgrade_outbox_table(from_version, to_version, schema=None)`` moves an existing table
  between versions, one step at a time, keeping every row: up, each step's columns are added
  (nullable, or with a server default that fills existing rows), its indexes created and the
  table comment set to the new version; down (``to_version < from_version``, what the reverse
  of an upgrade is), each step's rows are first made to mean the same to the older version where
  it needs that (version 4 unparks the rows it parked until due), its indexes are dropped, then
  its columns (their values with them), and the comment restored.

Every operation goes through ``operations.impl`` or Alembic's own column operations rather than
a live connection, so it works in online migrations, in offline ``alembic upgrade --sql`` mode,
and on PostgreSQL, SQLite, MySQL and MariaDB (where each index is created on its MySQL columns,
see :mod:`sqla_outbox.ddl`, and no trigger is created). SQLite drops columns with ``ALTER
TABLE ... DROP COLUMN``, which needs SQLite 3.35 (2021) or later and a column no index uses: the
downgrade drops the step's indexes first for that reason.

The trap: on PostgreSQL, ``CREATE INDEX`` blocks writes to the table (every ``enqueue``) while
it reads the whole table, and an outbox that was never purged is large. An upgrade creates its
indexes ``IF NOT EXISTS``, so an index built beforehand without that lock is kept: for version 3,
run ``CREATE INDEX CONCURRENTLY ix_outbox_published ON outbox (published_at) WHERE published_at
IS NOT NULL`` outside a transaction first (and check that it finished: psql lists an index a
failed build left behind as ``INVALID``), then the migration only records the version. Version
4's index is on the column the same step adds, so it cannot be built beforehand: it holds no
row yet (``WHERE wake_at IS NOT NULL``), but building it still reads the table under that lock,
so purge published rows first (:func:`sqla_outbox.purge`) to keep the upgrade short. On MySQL
and MariaDB, InnoDB builds an index in place while writes go on, so there is no such step; the
upgrade writes ``IF NOT EXISTS`` there for MariaDB only (MySQL 8 has no such clause, so on
MySQL an index built beforehand under the same name makes the migration fail: drop it first).
"""

from __future__ import annotations

from typing import Any

from alembic.operations import MigrateOperation, Operations
from sqlalchemy import Index, MetaData, Table
from sqlalchemy.schema import DDL

from sqla_outbox import ddl
from sqla_outbox.errors import ConfigurationError
from sqla_outbox.versions import (
    SCHEMA_VERSION,
    STEPS,
    TABLE_NAME,
    build_table,
    check_version,
    table_comment,
)

__all__ = [
    "FIRST_VERSION",
    "CreateOutboxTableOp",
    "DropOutboxTableOp",
    "UpgradeOutboxTableOp",
    "outbox_table",
]

FIRST_VERSION = 1
"""What a bare ``op.create_outbox_table()``/``op.drop_outbox_table()`` means: the first table."""


def outbox_table(schema: str | None = None, *, version: int = SCHEMA_VERSION) -> Table:
    """A new ``Table`` of table ``version`` (default: the version this sqla-outbox uses), with
    its indexes, placed in ``schema``, on a private ``MetaData``.

    A private ``MetaData`` rather than the library's table itself: the operations must be able to
    put the table in any schema, at any version, without mutating :data:`sqla_outbox.metadata`,
    which the running application shares.
    """
    return build_table(version, MetaData(), schema=schema)


def _indexes_by_name(indexes: Any) -> list[Index]:
    # A stable order, so offline SQL and logs read the same on every run.
    return sorted(indexes, key=lambda index: str(index.name))


@Operations.register_operation("create_outbox_table")
class CreateOutboxTableOp(MigrateOperation):
    """Create outbox table ``version`` and its indexes, exactly as that version is defined.

    One operation instead of ``create_table`` + ``create_index`` so autogenerate (see
    :mod:`alembic_ext.compare`) can write a single readable line, and so that the table, its
    partial indexes, its storage options and its column types always come from one source of
    truth, frozen per version.
    """

    def __init__(self, *, version: int = FIRST_VERSION, schema: str | None = None) -> None:
        self.version = check_version(version)
        self.schema = schema

    @classmethod
    def create_outbox_table(
        cls, operations: Operations, *, version: int = FIRST_VERSION, schema: str | None = None
    ) -> None:
        """Create outbox table ``version`` (default 1, the first released) in ``schema``.

        Pass the version explicitly in new migrations: ``version=outbox.SCHEMA_VERSION`` at the
        time of writing, as a literal (autogenerate writes it). ``schema=None`` means the
        connection's default schema, as everywhere in Alembic. The schema must already exist:
        creating schemas is the application's business.
        """
        operations.invoke(cls(version=version, schema=schema))

    def reverse(self) -> DropOutboxTableOp:
        """The matching drop, so autogenerate writes the downgrade for free."""
        return DropOutboxTableOp(version=self.version, schema=self.schema)

    def to_table(self) -> Table:
        """The table this operation creates, as a ``Table`` in its own ``MetaData``."""
        return outbox_table(self.schema, version=self.version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("add_table", table)``, so ``compare_metadata`` and ``alembic check`` can report it."""
        return ("add_table", self.to_table())

    def __repr__(self) -> str:
        return f"CreateOutboxTableOp(version={self.version!r}, schema={self.schema!r})"


@Operations.register_operation("drop_outbox_table")
class DropOutboxTableOp(MigrateOperation):
    """Drop the outbox's indexes, then the table: the inverse of :class:`CreateOutboxTableOp`.

    The indexes are dropped explicitly (most databases would drop them with the table) so the
    operation is symmetric in offline SQL scripts and on backends that keep orphaned indexes.
    """

    def __init__(self, *, version: int = FIRST_VERSION, schema: str | None = None) -> None:
        self.version = check_version(version)
        self.schema = schema

    @classmethod
    def drop_outbox_table(
        cls, operations: Operations, *, version: int = FIRST_VERSION, schema: str | None = None
    ) -> None:
        """Drop outbox table ``version`` (default 1) and its indexes from ``schema``.

        ``version`` must be the table's version at this point of the migration history: it names
        the indexes dropped and the table the downgrade recreates. Any rows still in the outbox
        are lost, published or not; drain the relay first.
        """
        operations.invoke(cls(version=version, schema=schema))

    def reverse(self) -> CreateOutboxTableOp:
        """The matching create, so a downgrade of a drop restores exactly that version."""
        return CreateOutboxTableOp(version=self.version, schema=self.schema)

    def to_table(self) -> Table:
        """The table this operation drops, as a ``Table`` in its own ``MetaData``."""
        return outbox_table(self.schema, version=self.version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("remove_table", table)``, mirroring Alembic's own ``DropTableOp``."""
        return ("remove_table", self.to_table())

    def __repr__(self) -> str:
        return f"DropOutboxTableOp(version={self.version!r}, schema={self.schema!r})"


@Operations.register_operation("upgrade_outbox_table")
class UpgradeOutboxTableOp(MigrateOperation):
    """Move the outbox table from ``from_version`` to ``to_version``, keeping every row.

    Either direction: the reverse of ``(1, 2)`` is ``(2, 1)``, which is what autogenerate writes
    into ``downgrade()``. A move of several versions (``(1, 3)``) makes each step in turn. Going
    down drops the later versions' columns and what they held.
    """

    def __init__(self, from_version: int, to_version: int, *, schema: str | None = None) -> None:
        self.from_version = check_version(from_version, argument="from_version")
        self.to_version = check_version(to_version, argument="to_version")
        if self.from_version == self.to_version:
            raise ConfigurationError(
                f"upgrade_outbox_table was given from_version = to_version = {from_version!r}, "
                "which changes nothing. Pass the table's version before this migration and the "
                "version it should have after it, e.g. upgrade_outbox_table(1, 2)."
            )
        self.schema = schema

    @classmethod
    def upgrade_outbox_table(
        cls,
        operations: Operations,
        from_version: int,
        to_version: int,
        *,
        schema: str | None = None,
    ) -> None:
        """Move the outbox table in ``schema`` from ``from_version`` to ``to_version``.

        The table must be ``from_version`` when the migration runs: the operation emits the DDL
        for that move (it does not inspect the database, so it also works offline).
        """
        operations.invoke(cls(from_version, to_version, schema=schema))

    def reverse(self) -> UpgradeOutboxTableOp:
        """The move back, so autogenerate writes the downgrade for free."""
        return UpgradeOutboxTableOp(self.to_version, self.from_version, schema=self.schema)

    def steps(self) -> list[tuple[int, int]]:
        """The single-version moves this operation makes, in order: ``[(1, 2), (2, 3)]`` for
        ``(1, 3)``, ``[(3, 2), (2, 1)]`` for ``(3, 1)``."""
        if self.from_version < self.to_version:
            return [(v, v + 1) for v in range(self.from_version, self.to_version)]
        return [(v, v - 1) for v in range(self.from_version, self.to_version, -1)]

    def to_diff_tuple(self) -> Any:
        """The diffs the move stands for, as a list (as Alembic's ``AlterColumnOp`` gives one):
        ``add_column``/``add_index`` up, ``remove_index``/``remove_column`` down, and the comment,
        each as ``compare_metadata`` would report it.
        """
        diffs: list[tuple[Any, ...]] = []
        for old, new in self.steps():
            old_table = outbox_table(self.schema, version=old)
            new_table = outbox_table(self.schema, version=new)
            if new > old:
                step = STEPS[new]
                diffs += [
                    ("add_column", self.schema, TABLE_NAME, new_table.c[name])
                    for name in step.column_names()
                ]
                diffs += [("add_index", _index(new_table, name)) for name in step.index_names()]
            else:
                step = STEPS[old]
                diffs += [("remove_index", _index(old_table, name)) for name in step.index_names()]
                diffs += [
                    ("remove_column", self.schema, TABLE_NAME, old_table.c[name])
                    for name in step.column_names()
                ]
            if new_table.comment is None:
                diffs.append(("remove_table_comment", new_table))
            else:
                diffs.append(("add_table_comment", new_table, old_table.comment))
        return diffs

    def __repr__(self) -> str:
        return (
            f"UpgradeOutboxTableOp({self.from_version!r}, {self.to_version!r}, "
            f"schema={self.schema!r})"
        )


def _index(table: Table, name: str) -> Index:
    return next(index for index in table.indexes if index.name == name)


@Operations.implementation_for(CreateOutboxTableOp)
def create_outbox_table(operations: Operations, operation: CreateOutboxTableOp) -> None:
    """Emit ``CREATE TABLE``, ``CREATE INDEX`` and (PostgreSQL) the table comment through the
    migration's DDL implementation.

    ``impl.create_table`` creates the table's indexes and comment too (it has done so in every
    Alembic release this package supports), so no separate ``create_index`` call is made: one
    would create each index twice.
    """
    table = operation.to_table()
    operations.impl.create_table(table)
    # The table has none of the model's after_create listeners: fillfactor and the notification
    # trigger on PostgreSQL (see sqla_outbox.ddl).
    _run_postgresql_ddl(operations, ddl.after_create(table))


@Operations.implementation_for(DropOutboxTableOp)
def drop_outbox_table(operations: Operations, operation: DropOutboxTableOp) -> None:
    """Emit ``DROP INDEX`` for each of the version's indexes, then ``DROP TABLE``."""
    table = operation.to_table()
    for index in _indexes_by_name(table.indexes):
        operations.impl.drop_index(index)
    operations.impl.drop_table(table)
    _run_postgresql_ddl(operations, ddl.after_drop(table))


@Operations.implementation_for(UpgradeOutboxTableOp)
def upgrade_outbox_table(operations: Operations, operation: UpgradeOutboxTableOp) -> None:
    """Emit each step's ``ALTER TABLE``/``CREATE INDEX``/``DROP INDEX`` and comment change.

    Up: add the step's columns (Alembic's ``add_column``, so defaults and types render as in
    any migration), create its indexes (``IF NOT EXISTS``: see the module docs), set the comment.
    Then make the rows kept mean the same to the new version where the step says how
    (:attr:`~sqla_outbox.versions.Step.after_addition`: version 5 unparks the rows parked behind
    a holder, which name none). Down: make the rows mean the same to the older version where the
    step says how (:attr:`~sqla_outbox.versions.Step.before_removal`: version 4 unparks the rows
    it parked until due), drop its indexes (SQLite refuses to drop an indexed column), then its
    columns, then restore the older comment.
    """
    schema = operation.schema
    for old, new in operation.steps():
        if new > old:
            table = outbox_table(schema, version=new)
            step = STEPS[new]
            for name in step.column_names():
                operations.add_column(TABLE_NAME, table.c[name], schema=schema)
            for name in sorted(step.index_names()):
                operations.impl.create_index(_index(table, name), if_not_exists=True)
            if step.after_addition is not None:
                operations.execute(step.after_addition(table))
        else:
            table = outbox_table(schema, version=old)
            step = STEPS[old]
            if step.before_removal is not None:
                operations.execute(step.before_removal(table))
            for name in sorted(step.index_names()):
                operations.impl.drop_index(_index(table, name))
            for name in reversed(step.column_names()):
                operations.drop_column(TABLE_NAME, name, schema=schema)
        _set_comment(operations, new, schema)


def _set_comment(operations: Operations, version: int, schema: str | None) -> None:
    # SQLite keeps no comments; there the version is read from the columns.
    if not operations.impl.dialect.supports_comments:
        return
    comment = table_comment(version)
    if comment is None:
        operations.drop_table_comment(TABLE_NAME, schema=schema)
    else:
        operations.create_table_comment(TABLE_NAME, comment, schema=schema)


def _run_postgresql_ddl(operations: Operations, statements: list[DDL]) -> None:
    if operations.impl.dialect.name == "postgresql":
        for statement in statements:
            operations.execute(statement)
