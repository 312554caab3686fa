"""``sqla-outbox inbox purge``: delete the inbox's keys older than the deduplication window
(:mod:`sqla_outbox.inbox.retention`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import click
from sqlalchemy.engine import Engine

from sqla_outbox.cli.common import url_option
from sqla_outbox.cli.purging import purge_options, run_purge

__all__ = ["inbox"]


@click.group()
def inbox() -> None:
    """The consumers' inbox: keys of the messages they processed (sqla_outbox.inbox)."""


@inbox.command("purge")
@url_option
@purge_options(
    "INBOX_",
    "Delete the keys received longer ago than this (90s, 15m, 12h, 7d or 2w): the "
    "deduplication window. A duplicate that arrives after its key is gone is processed again.",
    "keys",
)
@click.pass_context
def purge_keys(
    ctx: click.Context, url: str | None, older_than: dt.timedelta | None, batch_size: int
) -> int:
    """Delete the inbox keys older than --older-than, and print how many.

    In batches of their own short transactions, so consumers carry on meanwhile: run it beside
    them, e.g. daily from cron, with a window longer than any redelivery.
    """
    return run_purge(
        ctx,
        url,
        older_than,
        batch_size,
        prefix="INBOX_",
        purge=_purge,
        event="inbox.purge_progress",
        what="inbox key",
        doing="while purging inbox keys",
        fix="The batches deleted before it stay deleted; run the purge again for the rest.",
    )


def _purge(
    engine: Engine, older_than: dt.timedelta, batch_size: int, on_batch: Callable[[int], object]
) -> int:
    from sqla_outbox import inbox as inbox_module  # noqa: PLC0415 - only this command needs it

    return inbox_module.purge(
        engine, older_than=older_than, batch_size=batch_size, on_batch=on_batch
    )
