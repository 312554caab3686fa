"""``sqla-outbox dead list|retry|discard``: an operator's view of the dead letters
(:mod:`sqla_outbox.dead_letters`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence

import click
from sqlalchemy.engine import Connection

from sqla_outbox.cli.common import (
    CommandError,
    F,
    engine_for,
    first_line,
    outbox_transaction,
    plural,
    require_url,
    table,
    url_option,
)
from sqla_outbox.dead_letters import (
    DISCARD_PRIVILEGES,
    LIST_PRIVILEGES,
    RETRY_PRIVILEGES,
    DeadLetter,
    discard_dead_letters,
    message_ids,
    read_dead_letters,
    retry_dead_letters,
)
from sqla_outbox.errors import OutboxError

__all__ = ["dead"]


@click.group()
def dead() -> None:
    """List, retry or discard dead letters.

    A message becomes a dead letter after --max-publish-attempts failed publishes: no relay
    tries it again, and it holds back the later messages of its transaction and ordering key
    until it is retried (published again first, then what it held back) or discarded (never
    published; what it held back flows).
    """


@dead.command("list")
@url_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object per dead letter per line."
)
@click.pass_context
def list_dead(ctx: click.Context, url: str | None, as_json: bool) -> int:
    """Show the dead letters, in publishing order.

    The table shows the first line of each last error; --json prints the whole message with
    attempts, last_error and dead_at.
    """
    database_url = require_url(ctx, url)
    engine = engine_for(ctx, database_url)
    try:
        with outbox_transaction(
            engine,
            database_url,
            LIST_PRIVILEGES,
            needed_by="sqla-outbox dead list",
            doing="while reading the dead letters",
        ) as conn:
            letters = read_dead_letters(conn)
    finally:
        engine.dispose()
    if as_json:
        for letter in letters:
            click.echo(json.dumps(letter.to_dict(), ensure_ascii=False))
    else:
        click.echo(_dead_table(letters))
    return 0


def _dead_table(letters: list[DeadLetter]) -> str:
    if not letters:
        return "No dead letters."
    rows = [
        [
            str(letter.id),
            letter.job,
            letter.queue,
            letter.ordering_key or "-",
            str(letter.attempts),
            letter.dead_at.strftime("%Y-%m-%d %H:%M:%SZ"),
            first_line(letter.last_error),
        ]
        for letter in letters
    ]
    header = ["ID", "JOB", "QUEUE", "ORDERING KEY", "ATTEMPTS", "DEAD AT", "LAST ERROR"]
    return "\n".join([f"{plural(len(letters), 'dead letter')}:", *table(header, rows)])


def _ids_argument(command: F) -> F:
    return click.argument("ids", nargs=-1, metavar="[ID]...")(command)


def _all_option(verb: str) -> Callable[[F], F]:
    return click.option("--all", "every", is_flag=True, help=f"{verb} every dead letter.")


@dead.command("retry")
@url_option
@_all_option("Retry")
@_ids_argument
@click.pass_context
def retry_dead_command(
    ctx: click.Context, url: str | None, every: bool, ids: tuple[str, ...]
) -> int:
    """Retry dead letters now, attempts reset.

    Give the ids of the dead letters to retry (`sqla-outbox dead list` shows them), or --all.
    Each keeps its place: relays publish it before the messages it held back.
    """
    retried = _settle_dead(
        ctx, url, ids, every, verb="retry", privileges=RETRY_PRIVILEGES, settle=retry_dead_letters
    )
    click.echo(
        f"Retried {plural(len(retried), 'dead letter')}; relays publish "
        f"{'it' if len(retried) == 1 else 'them'} before what "
        f"{'it' if len(retried) == 1 else 'they'} held back."
        if retried
        else "Retried 0 dead letters."
    )
    return _not_dead(ids, retried)


@dead.command("discard")
@url_option
@_all_option("Discard")
@_ids_argument
@click.pass_context
def discard_dead_command(
    ctx: click.Context, url: str | None, every: bool, ids: tuple[str, ...]
) -> int:
    """Discard dead letters: never published.

    Give the ids of the dead letters to delete (`sqla-outbox dead list` shows them), or --all.
    The messages they held back are published next.
    """
    discarded = _settle_dead(
        ctx,
        url,
        ids,
        every,
        verb="discard",
        privileges=DISCARD_PRIVILEGES,
        settle=discard_dead_letters,
    )
    click.echo(
        f"Discarded {plural(len(discarded), 'dead letter')}; "
        f"{'it' if len(discarded) == 1 else 'they'} will never be published."
        if discarded
        else "Discarded 0 dead letters."
    )
    return _not_dead(ids, discarded)


def _settle_dead(
    ctx: click.Context,
    url: str | None,
    ids: tuple[str, ...],
    every: bool,
    *,
    verb: str,
    privileges: Sequence[str],
    settle: Callable[[Connection, list[uuid.UUID] | None], list[uuid.UUID]],
) -> list[uuid.UUID]:
    """Check the arguments, then retry or discard in one transaction; the ids acted on."""
    if every and ids:
        raise click.UsageError(
            f"Pass either the ids of the dead letters to {verb} or --all, not both.", ctx
        )
    if not every and not ids:
        raise click.UsageError(
            f"Pass the ids of the dead letters to {verb} (`sqla-outbox dead list` shows them), "
            f"or --all to {verb} every one.",
            ctx,
        )
    try:
        chosen = None if every else message_ids(ids)
    except OutboxError as error:
        raise click.UsageError(str(error), ctx) from error
    database_url = require_url(ctx, url)
    engine = engine_for(ctx, database_url)
    try:
        with outbox_transaction(
            engine,
            database_url,
            privileges,
            needed_by=f"sqla-outbox dead {verb}",
            doing=f"while {verb}ing dead letters",
        ) as conn:
            return settle(conn, chosen)
    finally:
        engine.dispose()


def _not_dead(given: tuple[str, ...], done: list[uuid.UUID]) -> int:
    """0, or (after saying which) 1 when some ids given were not dead letters."""
    acted = set(done)
    missing = [str(i) for i in message_ids(given) or [] if i not in acted]
    if not missing:
        return 0
    raise CommandError(
        f"{plural(len(missing), 'id')} given {'is' if len(missing) == 1 else 'are'} not a dead "
        f"letter (published, retried or discarded already, or never staged): "
        f"{', '.join(missing)}. `sqla-outbox dead list` shows the dead letters."
    )
