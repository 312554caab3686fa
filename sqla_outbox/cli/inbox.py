"""``sqla-outbox inbox purge``: delete the inbox's keys older than the deduplication window
(:mod:`sqla_outbox.inbox.retention`)."""

from __future__ import annotations

import datetime as dt

import click

from sqla_outbox.cli.common import (
    DurationType,
    database_errors,
    engine_for,
    env,
    plural,
    require_url,
    url_option,
)
from sqla_outbox.retention import PURGE_BATCH_SIZE, format_duration

__all__ = ["inbox"]


@click.group()
def inbox() -> None:
    """The consumers' inbox: keys of the messages they processed (sqla_outbox.inbox)."""


@inbox.command("purge")
@url_option
@click.option(
    "--older-than",
    type=DurationType(),
    envvar=env("INBOX_OLDER_THAN"),
    show_envvar=True,
    metavar="DURATION",
    help="Delete the keys received longer ago than this (90s, 15m, 12h, 7d or 2w): the "
    "deduplication window. A duplicate that arrives after its key is gone is processed again.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=PURGE_BATCH_SIZE,
    show_default=True,
    envvar=env("INBOX_PURGE_BATCH_SIZE"),
    show_envvar=True,
    metavar="N",
    help="Keys deleted per transaction.",
)
@click.pass_context
def purge_keys(
    ctx: click.Context, url: str | None, older_than: dt.timedelta | None, batch_size: int
) -> int:
    """Delete the inbox keys older than --older-than, and print how many.

    In batches of their own short transactions, so consumers carry on meanwhile: run it beside
    them, e.g. daily from cron, with a window longer than any redelivery.
    """
    from sqla_outbox import inbox as inbox_module  # noqa: PLC0415 - only this command needs it

    if older_than is None:
        raise click.UsageError(
            f"Missing option '--older-than'. Pass e.g. --older-than 7d, or set "
            f"{env('INBOX_OLDER_THAN')}.",
            ctx,
        )
    database_url = require_url(ctx, url)
    engine = engine_for(ctx, database_url)
    try:
        with database_errors(database_url, "while purging inbox keys"):
            deleted = inbox_module.purge(engine, older_than=older_than, batch_size=batch_size)
    finally:
        engine.dispose()
    click.echo(f"Purged {plural(deleted, 'inbox key')} older than {format_duration(older_than)}.")
    return 0
