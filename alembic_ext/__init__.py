"""Alembic support for the sqla-outbox table: the outbox operations and autogenerate.

The outbox table belongs to the library, not to your models, yet it has to reach your database
through *your* migrations, in the same history as the business tables it commits with. This
package makes that a one-liner, keeps autogenerate honest about it, and moves the table forward
when a new sqla-outbox needs a newer table.

What you write in ``env.py``
----------------------------
Two lines, nothing else (no ``autogenerate_plugins`` entry, no ``render_item`` hook)::

    import alembic_ext  # noqa: F401  registers the outbox operations + autogenerate support
    import sqla_outbox as outbox

    target_metadata = [app_metadata, outbox.metadata]   # your MetaData first, then the outbox's

Importing :mod:`alembic_ext` registers, process-wide:

* ``op.create_outbox_table(version=1, schema=None)``, ``op.drop_outbox_table(version=1,
  schema=None)`` and ``op.upgrade_outbox_table(from_version, to_version, schema=None)``
  (:class:`CreateOutboxTableOp`, :class:`DropOutboxTableOp`, :class:`UpgradeOutboxTableOp`, see
  :mod:`alembic_ext.ops`);
* their autogenerate renderers (:mod:`alembic_ext.render`);
* an autogenerate comparator (:mod:`alembic_ext.compare`) in Alembic's global comparator registry,
  which every autogenerate run uses, so it works with the default ``autogenerate_plugins``.

Table versions are frozen
-------------------------
The outbox table has numbered versions (:mod:`sqla_outbox.versions`; ``outbox.SCHEMA_VERSION``
is the one the installed sqla-outbox needs). A released version never changes, so
``op.create_outbox_table(version=N)`` creates version N exactly, whenever the migration runs and
whichever sqla-outbox is installed. A bare ``op.create_outbox_table()`` means version 1, the table
released first: migrations written before versions existed keep creating the table they created.
When a new sqla-outbox needs a newer table, it ships the step, and you add a migration::

    def upgrade():
        op.upgrade_outbox_table(4, 5)

    def downgrade():
        op.upgrade_outbox_table(5, 4)

Up, it adds the new version's columns (nullable, or with a default that fills existing rows),
creates its indexes and records the version in the table comment; down, it first makes the rows
mean the same to the older version where the step needs that (down from version 4, the rows
parked until they are due are unparked; both ways between 4 and 5, the rows parked behind another
row), then drops them again. A move over several versions
(``op.upgrade_outbox_table(1, 4)``) makes each step in turn. Every row is kept either way (going
down loses only what the dropped columns held). Until the migration has run, a relay refuses to
start with :class:`sqla_outbox.SchemaVersionError` naming ``op.upgrade_outbox_table``, and so do
``status`` and the dead-letter operations (``purge`` runs on version 3 on); ``enqueue`` fails
at commit with the same error when it writes a column the table lacks (version 3 adds only an
index and version 4 a column only relays write, so a version-2 or version-3 table still takes
new messages until the migration runs).

Autogenerate
------------
``alembic revision --autogenerate`` on a database without the outbox writes::

    import alembic_ext  # noqa: F401  (registers op.create_outbox_table and the rest)
    ...
    def upgrade():
        op.create_table('orders', ...)          # your tables, as usual
        op.create_outbox_table(version=5)

    def downgrade():
        op.drop_outbox_table(version=5)
        op.drop_table('orders')

instead of the outbox's columns and partial indexes spelled out. On a database whose outbox is
an older version it writes ``op.upgrade_outbox_table(4, 5)`` (or ``(1, 5)`` from version 1,
``(2, 5)`` from version 2, and so on; and the reverse, ``op.upgrade_outbox_table(5, 4)``, in
``downgrade()``) instead of Alembic's ``add_column``/``create_index`` for the new columns and
indexes. Once the table is current, autogenerate (and ``alembic check``) report nothing for it,
with ``compare_type`` and ``compare_server_default`` on. If you stop including
``outbox.metadata``, autogenerate writes ``op.drop_outbox_table(version=N)``, whose downgrade
recreates that version.

Writing migrations by hand
--------------------------
Call ``op.create_outbox_table(version=N)`` in ``upgrade()`` and ``op.drop_outbox_table(
version=N)`` in ``downgrade()``, N being ``outbox.SCHEMA_VERSION`` when you write it, as a
literal (never the constant itself: the migration must keep meaning the version it was written
for). Put ``import alembic_ext`` at the top of the migration (autogenerate does this for you) so
the operations exist even if the migration runs under an ``env.py`` that doesn't import it. To
keep the outbox in its own schema, create the schema first and pass it along (to every outbox
operation), and put the table in that schema in your target metadata so autogenerate agrees::

    op.execute("CREATE SCHEMA IF NOT EXISTS jobs")
    op.create_outbox_table(version=5, schema="jobs")

    # env.py
    outbox_md = MetaData()
    outbox.metadata.tables[outbox.TABLE_NAME].to_metadata(outbox_md, schema="jobs")
    target_metadata = [app_metadata, outbox_md]   # plus include_schemas=True in configure()

The operations emit DDL through Alembic's migration implementation, so offline mode
(``alembic upgrade head --sql``) prints ``CREATE TABLE outbox ...``, ``CREATE INDEX
ix_outbox_unpublished ... WHERE published_at IS NULL`` and, for an upgrade, ``ALTER TABLE outbox
ADD COLUMN ...`` like any other operation.

Things to know
--------------
* The operations build the table from the frozen definitions in the *installed*
  :mod:`sqla_outbox.versions`, not from a copy in the migration. That keeps migrations short, and
  because released versions never change, a migration replayed after upgrading sqla-outbox
  creates the same table it always did; the upgrade migrations that follow it in your history
  bring it forward.
* ``op.upgrade_outbox_table`` does not look at the database (so it works offline): it must run
  on a table that is ``from_version``. Autogenerate reads the version from the table's comment
  (PostgreSQL, version 2 on) or its columns and indexes; by hand,
  :func:`sqla_outbox.versions.table_version` tells.
* On PostgreSQL, building an index blocks writes to the table while it reads it; for a large
  outbox, build the new version's indexes concurrently first (see :mod:`alembic_ext.ops`).
* On SQLite the downgrade drops columns with ``ALTER TABLE ... DROP COLUMN``: SQLite 3.35+.
* On MySQL and MariaDB the same operations build the same versions in those databases' types,
  each partial index as a composite index led by its predicate's columns (see
  :class:`sqla_outbox.versions.IndexSpec`); autogenerate takes those indexes, and ``parked``'s
  default reported as ``0``, for the version's own, and is clean once the table is current.
* Autogenerate only rewrites a table that *is* the outbox (its columns, primary-key name and
  index names match a released version); an unrelated table of yours named ``outbox`` is left to
  Alembic. ``include_object``/``include_name`` filters apply first, as for any table.
* Without ``import alembic_ext`` in ``env.py`` none of this is registered, and autogenerate writes
  the outbox column by column typed ``sqla_outbox.coltypes.UTCDateTime(timezone=True)``, which the
  migration does not import (Alembic imports nothing for a type outside SQLAlchemy): it fails
  with ``NameError: name 'sqla_outbox' is not defined``, and the table would lack the
  PostgreSQL trigger and fillfactor. Add the import and autogenerate that migration again.
* Alembic >= 1.13. On 1.18+ the comparator is registered with ``DispatchPriority.LAST`` so it runs
  after the built-in table comparison; ``autogenerate_plugins`` does not need to mention it, and
  excluding Alembic's own plugins there does not disable it.
"""

from __future__ import annotations

from alembic_ext import compare as compare
from alembic_ext import inbox as inbox
from alembic_ext import render as render
from alembic_ext.compare import compare_outbox_table, is_outbox_table, outbox_version
from alembic_ext.ops import (
    CreateOutboxTableOp,
    DropOutboxTableOp,
    UpgradeOutboxTableOp,
    outbox_table,
)

__all__ = [
    "CreateOutboxTableOp",
    "DropOutboxTableOp",
    "UpgradeOutboxTableOp",
    "compare_outbox_table",
    "is_outbox_table",
    "outbox_table",
    "outbox_version",
]
