"""Alembic support for the sqla-outbox table: ``op.create_outbox_table()`` and autogenerate.

The outbox table belongs to the library, not to your models, yet it has to reach your database
through *your* migrations, in the same history as the business tables it commits with. This
package makes that a one-liner and keeps autogenerate honest about it.

What you write in ``env.py``
----------------------------
Two lines, nothing else (no ``autogenerate_plugins`` entry, no ``render_item`` hook)::

    import alembic_ext  # noqa: F401  registers op.create_outbox_table + autogenerate support
    import sqla_outbox as outbox

    target_metadata = [app_metadata, outbox.metadata]   # your MetaData first, then the outbox's

Importing :mod:`alembic_ext` registers, process-wide:

* ``op.create_outbox_table(schema=None)`` and ``op.drop_outbox_table(schema=None)``
  (:class:`CreateOutboxTableOp` / :class:`DropOutboxTableOp`, see :mod:`alembic_ext.ops`);
* their autogenerate renderers (:mod:`alembic_ext.render`);
* an autogenerate comparator (:mod:`alembic_ext.compare`) in Alembic's global comparator registry,
  which every autogenerate run uses, so it works with the default ``autogenerate_plugins``.

Then ``alembic revision --autogenerate`` on a database without the outbox writes::

    import alembic_ext  # noqa: F401  (registers op.create_outbox_table)
    ...
    def upgrade():
        op.create_table('orders', ...)          # your tables, as usual
        op.create_outbox_table()

    def downgrade():
        op.drop_outbox_table()
        op.drop_table('orders')

instead of the outbox's sixteen columns and its partial index spelled out. Once the table exists,
autogenerate (and ``alembic check``) report nothing for it, with ``compare_type`` and
``compare_server_default`` on. If you stop including ``outbox.metadata``, autogenerate writes
``op.drop_outbox_table()``, whose downgrade recreates the table.

Writing migrations by hand
--------------------------
Call ``op.create_outbox_table()`` in ``upgrade()`` and ``op.drop_outbox_table()`` in
``downgrade()``. Put ``import alembic_ext`` at the top of the migration (autogenerate does this for
you) so the operation exists even if the migration runs under an ``env.py`` that doesn't import
it. To keep the outbox in its own schema, create the schema first and pass it along, and put the
table in that schema in your target metadata so autogenerate agrees::

    op.execute("CREATE SCHEMA IF NOT EXISTS jobs")
    op.create_outbox_table(schema="jobs")

    # env.py
    outbox_md = MetaData()
    outbox.metadata.tables[outbox.TABLE_NAME].to_metadata(outbox_md, schema="jobs")
    target_metadata = [app_metadata, outbox_md]   # plus include_schemas=True in configure()

The operations emit DDL through Alembic's migration implementation, so offline mode
(``alembic upgrade head --sql``) prints ``CREATE TABLE outbox ...`` and
``CREATE INDEX ix_outbox_unpublished ... WHERE published_at IS NULL`` like any other operation.

Things to know
--------------
* The operations build the table from the *installed* :mod:`sqla_outbox.model`, not from a copy
  frozen into the migration. That keeps migrations short and always matching the library, but it
  means a migration replayed after upgrading sqla-outbox creates the then-current table. A future
  release that changes the table will ship its own operation to move an existing table forward.
* Autogenerate only rewrites a table that *is* the outbox (its columns, primary-key name and
  index names match :mod:`sqla_outbox.model`); an unrelated table of yours named ``outbox`` is
  left to Alembic. ``include_object``/``include_name`` filters apply first, as for any table.
* Without ``import alembic_ext`` in ``env.py`` none of this is registered, and autogenerate writes
  the outbox column by column typed ``sqla_outbox.model.UTCDateTime(timezone=True)``, which the
  migration does not import (Alembic imports nothing for a type outside SQLAlchemy): it fails
  with ``NameError: name 'sqla_outbox' is not defined``, and the table would lack the
  PostgreSQL trigger and fillfactor. Add the import and autogenerate that migration again.
* Alembic >= 1.13. On 1.18+ the comparator is registered with ``DispatchPriority.LAST`` so it runs
  after the built-in table comparison; ``autogenerate_plugins`` does not need to mention it, and
  excluding Alembic's own plugins there does not disable it.
"""

from __future__ import annotations

from alembic_ext import compare as compare
from alembic_ext import render as render
from alembic_ext.compare import compare_outbox_table, is_outbox_table
from alembic_ext.ops import CreateOutboxTableOp, DropOutboxTableOp, outbox_table

__all__ = [
    "CreateOutboxTableOp",
    "DropOutboxTableOp",
    "compare_outbox_table",
    "is_outbox_table",
    "outbox_table",
]
