"""Autogenerate renderers: how the outbox operations are written into a migration script.

Without a renderer Alembic cannot put a custom operation into a generated file. The version is
always written out (``op.create_outbox_table(version=5)``, ``op.upgrade_outbox_table(4, 5)``):
a bare ``op.create_outbox_table()`` means version 1, the table released first, so the explicit
number is what keeps a generated migration meaning the table it was generated for. ``schema=``
is written only when the table lives outside the default schema.

Each renderer also adds ``import alembic_ext`` to the script's imports (the ``${imports}`` slot of
``script.py.mako``), so the migration registers the operations it calls even when it is run from an
``env.py`` that never imported this package.
"""

from __future__ import annotations

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext

from alembic_ext.ops import CreateOutboxTableOp, DropOutboxTableOp, UpgradeOutboxTableOp

__all__ = [
    "IMPORT_LINE",
    "render_call",
    "render_create_outbox_table",
    "render_drop_outbox_table",
    "render_upgrade_outbox_table",
    "schema_argument",
]

#: Added to a generated migration's imports; ``noqa`` because the import is used for its effect.
IMPORT_LINE = "import alembic_ext  # noqa: F401  (registers op.create_outbox_table and the rest)"


def _prefix(autogen_context: AutogenContext) -> str:
    # Honour env.py's ``alembic_module_prefix`` as Alembic's own renderers do.
    prefix = autogen_context.opts.get("alembic_module_prefix")
    return prefix if isinstance(prefix, str) else "op."


def render_call(autogen_context: AutogenContext, name: str, *arguments: str | None) -> str:
    """``op.<name>(<arguments>)`` (``None`` arguments left out), with ``import alembic_ext``
    added to the script's imports: how every operation of this package is written."""
    autogen_context.imports.add(IMPORT_LINE)
    written = ", ".join(argument for argument in arguments if argument is not None)
    return f"{_prefix(autogen_context)}{name}({written})"


def schema_argument(schema: str | None) -> str | None:
    """``schema=...`` when the table is outside the default schema, else nothing."""
    return None if schema is None else f"schema={schema!r}"


@renderers.dispatch_for(CreateOutboxTableOp)
def render_create_outbox_table(autogen_context: AutogenContext, op: CreateOutboxTableOp) -> str:
    """Render ``op.create_outbox_table(version=N)`` (``schema=...`` only when one is set)."""
    return render_call(
        autogen_context,
        "create_outbox_table",
        f"version={op.version!r}",
        schema_argument(op.schema),
    )


@renderers.dispatch_for(DropOutboxTableOp)
def render_drop_outbox_table(autogen_context: AutogenContext, op: DropOutboxTableOp) -> str:
    """Render ``op.drop_outbox_table(version=N)`` (``schema=...`` only when one is set)."""
    return render_call(
        autogen_context, "drop_outbox_table", f"version={op.version!r}", schema_argument(op.schema)
    )


@renderers.dispatch_for(UpgradeOutboxTableOp)
def render_upgrade_outbox_table(autogen_context: AutogenContext, op: UpgradeOutboxTableOp) -> str:
    """Render ``op.upgrade_outbox_table(FROM, TO)`` (``schema=...`` only when one is set)."""
    return render_call(
        autogen_context,
        "upgrade_outbox_table",
        repr(op.from_version),
        repr(op.to_version),
        schema_argument(op.schema),
    )
