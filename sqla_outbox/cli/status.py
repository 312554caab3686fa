"""``sqla-outbox status``: the backlog, who holds it and which failed rows hold back others;
with ``--max-age`` or ``--max-dead``, a check for cron or a probe.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import click
from sqlalchemy.engine import URL, Engine

from sqla_outbox.backlog import OutboxStatus, read_status
from sqla_outbox.cli.common import (
    engine_for,
    env,
    first_line,
    flag_error,
    lease_option,
    outbox_transaction,
    plural,
    require_url,
    table,
    url_option,
)
from sqla_outbox.errors import ConfigurationError
from sqla_outbox.preflight import (
    STATUS_PRIVILEGES,
)
from sqla_outbox.settings import resolve_claim_lease

__all__ = ["THRESHOLD_CROSSED", "status"]


THRESHOLD_CROSSED = 3
"""Exit code of ``status`` when a ``--max-age`` or ``--max-dead`` threshold is crossed."""


@click.command()
@url_option
@lease_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--max-age",
    type=click.FloatRange(min=0),
    envvar=env("MAX_AGE"),
    show_envvar=True,
    metavar="SECONDS",
    help=f"Exit {THRESHOLD_CROSSED} if a due message has waited longer than this since it came "
    "due (since staged, or since its run_at if later; messages scheduled for later do not count).",
)
@click.option(
    "--max-dead",
    type=click.IntRange(min=0),
    envvar=env("MAX_DEAD"),
    show_envvar=True,
    metavar="N",
    help=f"Exit {THRESHOLD_CROSSED} if there are more than N dead letters (0: any).",
)
@click.pass_context
def status(
    ctx: click.Context,
    *,
    url: str | None,
    claim_lease: float,
    as_json: bool,
    max_age: float | None,
    max_dead: int | None,
) -> int:
    """Show the backlog: pending and due rows, the longest wait since due, failures, claims.

    A claim older than --claim-lease has lapsed: its relay is presumed dead and any relay may
    take those rows. Failed rows (backing off or dead) are listed with their last error: each
    holds back the later messages of its transaction and ordering key.

    With --max-age or --max-dead it is a check for cron or a probe: after the report it says on
    stderr which threshold was crossed and exits 3 (1 means the outbox could not be read).
    """
    if max_age is not None and not math.isfinite(max_age):
        raise click.BadParameter(
            f"must be a finite number of seconds, got {max_age!r}. Pass e.g. --max-age 300.",
            ctx,
            param_hint="'--max-age'",
        )
    database_url = require_url(ctx, url)
    try:
        lease = resolve_claim_lease(claim_lease)
    except ConfigurationError as error:
        raise flag_error(ctx, error) from error
    engine = engine_for(ctx, database_url)
    try:
        report = _collect_status(engine, database_url, lease)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(_status_table(report))
    crossed = _thresholds_crossed(report, max_age, max_dead)
    for line in crossed:
        click.echo(f"Threshold crossed: {line}", err=True)
    return THRESHOLD_CROSSED if crossed else 0


def _thresholds_crossed(
    report: OutboxStatus, max_age: float | None, max_dead: int | None
) -> list[str]:
    crossed = []
    age = report.oldest_pending_age_seconds
    if max_age is not None and age is not None and age > max_age:
        crossed.append(
            f"a message has waited {_seconds(age)} since it came due, over --max-age {max_age:g}."
        )
    if max_dead is not None and report.dead > max_dead:
        crossed.append(
            f"{plural(report.dead, 'dead letter')}, over --max-dead {max_dead} "
            "(`sqla-outbox dead list` shows them)."
        )
    return crossed


def _collect_status(engine: Engine, url: URL, lease: dt.timedelta) -> OutboxStatus:
    with outbox_transaction(
        engine,
        url,
        STATUS_PRIVILEGES,
        needed_by="sqla-outbox status",
        doing="while reading the outbox",
    ) as conn:
        return read_status(conn, lease)


def _status_table(report: OutboxStatus) -> str:
    age = report.oldest_pending_age_seconds
    lines = [
        f"Outbox at {report.url}",
        f"  pending (unpublished)     {report.pending}",
        f"  due now                   {report.due}",
        f"  longest wait since due    {'-' if age is None else _seconds(age)}",
        f"  with failed attempts      {report.failing}",
        f"  backing off (retrying)    {report.backing_off}",
        f"  dead letters              {report.dead}",
        f"  parked (held back)        {report.parked}",
        "",
    ]
    if report.holding:
        shown = len(report.holding)
        of = f"first {shown} of {report.failing}" if report.failing > shown else str(shown)
        lines.append(
            f"Failed rows, holding back the later rows of their transaction and ordering key "
            f"({of}):"
        )
        states = {"dead": "dead letter", "backing_off": "backing off", "due": "due for retry"}
        lines += table(
            ["ID", "JOB", "ORDERING KEY", "ATTEMPTS", "STATE", "LAST ERROR"],
            [
                [
                    row.id,
                    row.job,
                    row.ordering_key or "-",
                    str(row.attempts),
                    states[row.state],
                    first_line(row.last_error),
                ]
                for row in report.holding
            ],
        )
        if report.dead:
            lines.append("  Dead letters: see `sqla-outbox dead list`, then `dead retry|discard`.")
        lines.append("")
    if report.inbox is not None:
        oldest = report.inbox.oldest_received_at or "-"
        lines += [f"Inbox: {report.inbox.keys} keys, the oldest received {oldest}", ""]
    if not report.relays:
        lines.append("Live claims: none")
        return "\n".join(lines)
    lines.append(f"Live claims (lease {report.claim_lease_seconds:g} s):")
    width = max(len("RELAY"), *(len(r.relay_id) for r in report.relays))
    lines.append(f"  {'RELAY':<{width}}  CLAIMS  ROWS HELD  CLAIM AGE")
    for entry in report.relays:
        note = "  lapsed: any relay may retake these rows" if entry.lapsed else ""
        lines.append(
            f"  {entry.relay_id:<{width}}  {entry.claims:>6}  {entry.rows_held:>9}  "
            f"{_seconds(entry.claim_age_seconds):>9}{note}"
        )
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.1f} s"
