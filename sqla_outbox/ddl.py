"""DDL that goes with the outbox table beyond what ``MetaData`` describes: PostgreSQL's storage
and trigger, and the outbox's indexes on MySQL and MariaDB.

PostgreSQL:

* ``fillfactor = 50``: every row is updated twice after its insert (claim, mark). Free space on
  each page lets those updates stay HOT (heap-only tuples: no index entries rewritten), which
  keeps the claim fast and the table compact under a steady stream. It is set with ``ALTER
  TABLE`` rather than as a table option because SQLAlchemy 2.0 does not accept one.
* The ``AFTER INSERT`` notification trigger and its function (:mod:`sqla_outbox.notify`). Core
  cannot express a trigger function, so its SQL lives in ``sqla_outbox/sql/``.

The same statements run after ``outbox.metadata.create_all()`` (table events registered here)
and inside ``op.create_outbox_table(version=N)``, which builds its own copy of the table and so
calls :func:`after_create` itself. ``%(fullname)s`` is the (schema-qualified) table name.

MySQL and MariaDB have no partial indexes. There, ``CREATE INDEX`` for one of the outbox's
indexes names the columns of :attr:`~sqla_outbox.versions.IndexSpec.mysql_columns` (the
predicate's columns first; see :class:`~sqla_outbox.versions.IndexSpec` for why) instead of the
``Index``'s own, which stay what PostgreSQL and SQLite build. It is a compilation rule for
``CreateIndex`` on those two dialects (``sqlalchemy.ext.compiler``), registered when this module
is imported (``import sqla_outbox`` does), so ``metadata.create_all()``, the Alembic operations and
offline ``--sql`` output all build the same index. Every other index compiles as SQLAlchemy
compiles it. ``IF NOT EXISTS`` (which ``op.upgrade_outbox_table`` asks for) is written for
MariaDB only: MySQL 8 has no such clause. No trigger is created there: relays poll.

These statements belong to every released table version (:mod:`sqla_outbox.versions`), so they
are frozen like the versions: a migration replayed years from now must build what it built
today. Changing the trigger, its function or the fillfactor means a new table version whose
upgrade step replaces them, with the new SQL in new files; never edit these in place.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import DDL, CreateIndex
from sqlalchemy.sql.compiler import DDLCompiler

from sqla_outbox.model import OutboxRow
from sqla_outbox.versions import mysql_index_columns

__all__ = ["FILLFACTOR", "after_create", "after_drop"]

FILLFACTOR = 50
"""PostgreSQL fillfactor of the outbox table (see the module docs)."""


def _sql(name: str) -> str:
    return resources.files("sqla_outbox.sql").joinpath(name).read_text(encoding="utf-8")


def _postgresql(statement: str, table: Table) -> DDL:
    ddl = DDL(statement)  # type: ignore[no-untyped-call]
    return ddl.execute_if(dialect="postgresql").against(table)


def after_create(table: Table) -> list[DDL]:
    """Statements to run after ``CREATE TABLE``: fillfactor, notify function, trigger."""
    return [
        _postgresql(f"ALTER TABLE %(fullname)s SET (fillfactor = {FILLFACTOR})", table),
        _postgresql(_sql("notify_function.sql"), table),
        _postgresql(_sql("notify_trigger.sql"), table),
    ]


def after_drop(table: Table) -> list[DDL]:
    """Statements to run after ``DROP TABLE`` (which drops the trigger): the function."""
    return [_postgresql("DROP FUNCTION IF EXISTS %(fullname)s_notify()", table)]


_table: Table = OutboxRow.__table__  # type: ignore[assignment]
for _ddl in after_create(_table):
    event.listen(_table, "after_create", _ddl)
for _ddl in after_drop(_table):
    event.listen(_table, "after_drop", _ddl)


@compiles(CreateIndex, "mysql")
@compiles(CreateIndex, "mariadb")
def _create_index_on_mysql(create: CreateIndex, compiler: DDLCompiler, **kw: Any) -> str:
    """``CREATE INDEX`` on MySQL/MariaDB: an outbox index on its MySQL columns (module docs)."""
    index = create.element
    columns = mysql_index_columns(index)
    if columns is None:
        default: str = compiler.visit_create_index(create, **kw)  # type: ignore[no-untyped-call]
        return default
    preparer = compiler.preparer
    mariadb = getattr(compiler.dialect, "is_mariadb", False)
    exists = "IF NOT EXISTS " if create.if_not_exists and mariadb else ""
    listed = ", ".join(preparer.quote(column) for column in columns)
    return (
        f"CREATE INDEX {exists}{preparer.format_index(index)} "
        f"ON {preparer.format_table(index.table)} ({listed})"  # type: ignore[arg-type]
    )
