"""Autogenerate renderers: how the outbox operations are written into a migration script.

Without a renderer Alembic cannot put a custom operation into a generated file. The rendered call
takes ``schema=`` only when the table lives outside the default schema, so the common case reads
as the one line a person would write: ``op.create_outbox_table()``.

Each renderer also adds ``import alembic_ext`` to the script's imports (the ``${imports}`` slot of
``script.py.mako``), so the migration registers the operations it calls even when it is run from an
``env.py`` that never imported this package.
"""

from __future__ import annotations

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext

from alembic_ext.ops import CreateOutboxTableOp, DropOutboxTableOp

__all__ = ["IMPORT_LINE", "render_create_outbox_table", "render_drop_outbox_table"]

#: Added to a generated migration's imports; ``noqa`` because the import is used for its effect.
IMPORT_LINE = "import alembic_ext  # noqa: F401  (registers op.create_outbox_table)"


def _prefix(autogen_context: AutogenContext) -> str:
    # Honour env.py's ``alembic_module_prefix`` as Alembic's own renderers do.
    prefix = autogen_context.opts.get("alembic_module_prefix")
    return prefix if isinstance(prefix, str) else "op."


def _arguments(schema: str | None) -> str:
    return "" if schema is None else f"schema={schema!r}"


@renderers.dispatch_for(CreateOutboxTableOp)
def render_create_outbox_table(autogen_context: AutogenContext, op: CreateOutboxTableOp) -> str:
    """Render ``op.create_outbox_table()`` (``schema=...`` only when one is set)."""
    autogen_context.imports.add(IMPORT_LINE)
    return f"{_prefix(autogen_context)}create_outbox_table({_arguments(op.schema)})"


@renderers.dispatch_for(DropOutboxTableOp)
def render_drop_outbox_table(autogen_context: AutogenContext, op: DropOutboxTableOp) -> str:
    """Render ``op.drop_outbox_table()`` (``schema=...`` only when one is set)."""
    autogen_context.imports.add(IMPORT_LINE)
    return f"{_prefix(autogen_context)}drop_outbox_table({_arguments(op.schema)})"
