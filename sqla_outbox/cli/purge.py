"""``sqla-outbox purge``: delete old published rows (:mod:`sqla_outbox.retention`)."""

from __future__ import annotations

import datetime as dt

import click

from sqla_outbox import retention
from sqla_outbox.cli.common import (
    DurationType,
    database_errors,
    engine_for,
    env,
    logging_to_stderr,
    plural,
    require_url,
    url_option,
)
from sqla_outbox.cli.progress import Progress

__all__ = ["purge_command"]


_PURGE_FIX = "The batches deleted before it stay deleted; run the purge again for the rest."


@click.command("purge")
@url_option
@click.option(
    "--older-than",
    type=DurationType(),
    envvar=env("OLDER_THAN"),
    show_envvar=True,
    metavar="DURATION",
    help="Delete the rows published longer ago than this: 90s, 15m, 12h, 7d or 2w.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=retention.PURGE_BATCH_SIZE,
    show_default=True,
    envvar=env("PURGE_BATCH_SIZE"),
    show_envvar=True,
    metavar="N",
    help="Rows deleted per transaction.",
)
@click.pass_context
def purge_command(
    ctx: click.Context, url: str | None, older_than: dt.timedelta | None, batch_size: int
) -> int:
    """Delete published rows older than --older-than, and print how many.

    Never an unpublished row or a dead letter. Rows go in batches, each in a short transaction of
    its own, so relays and the application carry on meanwhile: run it beside them, e.g. daily
    from cron. Needs outbox table version 3, and DELETE on the table.
    """
    if older_than is None:
        raise click.UsageError(
            f"Missing option '--older-than'. Pass e.g. --older-than 7d, or set "
            f"{env('OLDER_THAN')}.",
            ctx,
        )
    database_url = require_url(ctx, url)
    engine = engine_for(ctx, database_url)
    try:
        with database_errors(database_url), engine.connect():
            pass
        progress = Progress("purge.progress", "purging", "rows")
        try:
            # Progress log lines go to stderr, as the relay's do; stdout keeps the result.
            with (
                logging_to_stderr("info"),
                database_errors(database_url, "while purging published rows", _PURGE_FIX),
            ):
                deleted = retention.purge(
                    engine,
                    older_than=older_than,
                    batch_size=batch_size,
                    on_batch=progress.advance,
                )
        finally:
            progress.finish()
    finally:
        engine.dispose()
    click.echo(
        f"Purged {plural(deleted, 'published row')} older than "
        f"{retention.format_duration(older_than)}."
    )
    return 0
