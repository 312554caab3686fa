"""Alembic environment for the sqla-outbox example: the app's ``orders`` table plus the outbox.

The two lines that matter for sqla-outbox are marked ``<-- sqla-outbox``; everything else is an
ordinary ``env.py``. Which database:

1. ``sqlalchemy.url`` from the Alembic config, if set (``alembic.ini`` or
   ``Config.set_main_option``): an explicit setting wins, so a test pinned to its own database
   can't be redirected by a stray environment variable;
2. else the ``SQLA_OUTBOX_URL`` environment variable;
3. else the SQLite file ``outbox_example.sqlite3`` next to this file.

Set ``config.attributes["configure_logging"] = False`` to keep ``env.py`` from applying the
``[loggers]`` section of ``alembic.ini`` (tests do, so they don't reset the host's logging).
"""

from __future__ import annotations

import os
import sys
from logging.config import fileConfig
from pathlib import Path

from alembic import context
from sqlalchemy import pool

import alembic_ext  # noqa: F401  <-- sqla-outbox: the outbox operations + autogenerate support
import sqla_outbox as outbox
from sqla_outbox.engines import create_engine

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the app's models sit next to this file in the example
    sys.path.insert(0, str(HERE))

from app_models import app_metadata  # noqa: E402

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = [app_metadata, outbox.metadata]  # <-- sqla-outbox: the outbox's MetaData too


def database_url() -> str:
    """The database to migrate; see the module docstring for the order of precedence."""
    configured = config.get_main_option("sqlalchemy.url")
    if configured:
        return configured
    from_env = os.environ.get("SQLA_OUTBOX_URL")
    if from_env:
        return from_env
    return f"sqlite:///{HERE / 'outbox_example.sqlite3'}"


def run_migrations_offline() -> None:
    """Write the migrations' SQL to stdout (``alembic upgrade head --sql``)."""
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations against the database.

    The engine comes from :func:`sqla_outbox.create_engine`, which gives SQLite real
    transactions; ``compare_server_default`` is on so ``alembic check`` is as strict as it gets.
    """
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                compare_type=True,
                compare_server_default=True,
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
