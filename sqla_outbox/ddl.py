"""PostgreSQL-only DDL that goes with the outbox table, beyond what ``MetaData`` describes.

* ``fillfactor = 50``: every row is updated twice after its insert (claim, mark). Free space on
  each page lets those updates stay HOT (heap-only tuples: no index entries rewritten), which
  keeps the claim fast and the table compact under a steady stream. It is set with ``ALTER
  TABLE`` rather than as a table option because SQLAlchemy 2.0 does not accept one.
* The ``AFTER INSERT`` notification trigger and its function (:mod:`sqla_outbox.notify`). Core
  cannot express a trigger function, so its SQL lives in ``sqla_outbox/sql/``.

The same statements run after ``outbox.metadata.create_all()`` (table events registered here)
and inside ``op.create_outbox_table(version=N)``, which builds its own copy of the table and so
calls :func:`after_create` itself. ``%(fullname)s`` is the (schema-qualified) table name.

These statements belong to every released table version (:mod:`sqla_outbox.versions`), so they
are frozen like the versions: a migration replayed years from now must build what it built
today. Changing the trigger, its function or the fillfactor means a new table version whose
upgrade step replaces them, with the new SQL in new files; never edit these in place.
"""

from __future__ import annotations

from importlib import resources

from sqlalchemy import Table, event
from sqlalchemy.schema import DDL

from sqla_outbox.model import OutboxRow

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
