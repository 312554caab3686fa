"""What the two purge commands share (``purge`` of published rows, ``inbox purge`` of inbox
keys): their ``--older-than`` and ``--batch-size`` options, and the run itself (connect first,
so a bad URL is "cannot connect"; batches with progress on stderr; the count on stdout)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

import click
from sqlalchemy.engine import Engine

from sqla_outbox import retention
from sqla_outbox.cli.common import (
    DurationType,
    database_errors,
    engine_for,
    env,
    logging_to_stderr,
    plural,
    require_url,
)
from sqla_outbox.cli.progress import Progress

__all__ = ["purge_options", "run_purge"]

F = TypeVar("F", bound=Callable[..., Any])

Purge = Callable[[Engine, dt.timedelta, int, Callable[[int], object]], int]
"""``purge(engine, older_than, batch_size, on_batch)``: deletes, returns how many."""


def purge_options(prefix: str, older_than_help: str, unit: str) -> Callable[[F], F]:
    """``--older-than`` and ``--batch-size``, read also from ``SQLA_OUTBOX_<prefix>OLDER_THAN``
    and ``SQLA_OUTBOX_<prefix>PURGE_BATCH_SIZE``; ``unit`` is what a batch counts (plural)."""

    def decorate(command: F) -> F:
        command = click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=retention.PURGE_BATCH_SIZE,
            show_default=True,
            envvar=env(f"{prefix}PURGE_BATCH_SIZE"),
            show_envvar=True,
            metavar="N",
            help=f"{unit.capitalize()} deleted per transaction.",
        )(command)
        return click.option(
            "--older-than",
            type=DurationType(),
            envvar=env(f"{prefix}OLDER_THAN"),
            show_envvar=True,
            metavar="DURATION",
            help=older_than_help,
        )(command)

    return decorate


def run_purge(
    ctx: click.Context,
    url: str | None,
    older_than: dt.timedelta | None,
    batch_size: int,
    *,
    prefix: str,
    purge: Purge,
    event: str,
    what: str,
    doing: str,
    fix: str,
) -> int:
    """Run ``purge`` as a command: ``event`` is its progress log event, ``what`` names one
    deleted item (``published row``), ``doing`` and ``fix`` word a database error met midway."""
    if older_than is None:
        raise click.UsageError(
            f"Missing option '--older-than'. Pass e.g. --older-than 7d, or set "
            f"{env(f'{prefix}OLDER_THAN')}.",
            ctx,
        )
    database_url = require_url(ctx, url)
    engine = engine_for(ctx, database_url)
    try:
        with database_errors(database_url), engine.connect():
            pass
        progress = Progress(event, "purging", f"{what}s")
        try:
            # Progress log lines go to stderr, as the relay's do; stdout keeps the result.
            with logging_to_stderr("info"), database_errors(database_url, doing, fix):
                deleted = purge(engine, older_than, batch_size, progress.advance)
        finally:
            progress.finish()
    finally:
        engine.dispose()
    click.echo(
        f"Purged {plural(deleted, what)} older than {retention.format_duration(older_than)}."
    )
    return 0
