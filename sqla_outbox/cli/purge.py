"""``sqla-outbox purge``: delete old published rows (:mod:`sqla_outbox.retention`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import click
from sqlalchemy.engine import Engine

from sqla_outbox import retention
from sqla_outbox.cli.common import url_option
from sqla_outbox.cli.purging import purge_options, run_purge

__all__ = ["purge_command"]


_PURGE_FIX = "The batches deleted before it stay deleted; run the purge again for the rest."


@click.command("purge")
@url_option
@purge_options(
    "",
    "Delete the rows published longer ago than this: 90s, 15m, 12h, 7d or 2w.",
    "rows",
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
    return run_purge(
        ctx,
        url,
        older_than,
        batch_size,
        prefix="",
        purge=_purge,
        event="purge.progress",
        what="published row",
        doing="while purging published rows",
        fix=_PURGE_FIX,
    )


def _purge(
    engine: Engine, older_than: dt.timedelta, batch_size: int, on_batch: Callable[[int], object]
) -> int:
    return retention.purge(engine, older_than=older_than, batch_size=batch_size, on_batch=on_batch)
