"""The ``sqla-outbox`` console script: ``relay``, ``status`` and ``demo``.

``relay`` runs a :class:`~sqla_outbox.Relay` in the foreground; ``status`` shows the backlog
and who holds it; ``demo`` tells the whole story on a throwaway SQLite database.

Every option is also read from an environment variable (``SQLA_OUTBOX_URL``,
``SQLA_OUTBOX_PUBLISHER``, ...; ``--help`` lists them), so a container needs no command line.

Errors a user can cause print one sentence with the fix on stderr and exit non-zero: ``2`` for
a bad option (a malformed ``--url``, a database other than PostgreSQL or SQLite, a driver that is
not installed or is asyncio-only, a publisher that cannot be imported), ``1`` for the rest (an
unreachable database, a missing table, a role without the privileges the command needs). The
URL and the table are checked before the command starts (:mod:`sqla_outbox.preflight`), so a
relay that cannot work exits at once instead of logging the same error forever. They never print
a traceback; a traceback means a bug in sqla-outbox. Database URLs are always shown with the
password hidden.

Exit codes of ``relay``: ``0`` after ``--once`` published everything due, or after SIGINT or
SIGTERM (the pass in flight finishes and its marks are written first); ``1`` if a publish failed
under ``--once`` or the database cannot be used; ``2`` for a bad option.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import sqlalchemy as sa
from click.core import ParameterSource
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError

from sqla_outbox import queries
from sqla_outbox.engines import hide_password
from sqla_outbox.errors import ConfigurationError, OutboxError, PublisherError
from sqla_outbox.logs import LogfmtFormatter, log_event
from sqla_outbox.preflight import (
    RELAY_PRIVILEGES,
    STATUS_PRIVILEGES,
    check_outbox_table,
    database_url,
    engine_from_url,
)
from sqla_outbox.publishers import PublisherLike
from sqla_outbox.publishers.loader import resolve_publisher
from sqla_outbox.publishers.schemes import BROKERS
from sqla_outbox.relay import Relay
from sqla_outbox.schema_errors import is_permission_denied, raise_if_missing_table
from sqla_outbox.settings import DEFAULT_CLAIM_LEASE, resolve_claim_lease

__all__ = ["cli", "main"]

log = logging.getLogger("sqla_outbox.cli")

ENV_PREFIX = "SQLA_OUTBOX_"
URL_EXAMPLE = "postgresql+psycopg://user:password@host/dbname"
LOG_LEVELS = ("debug", "info", "warning", "error")

# Relay constructor argument -> the CLI option that feeds it. The library's messages start with
# the argument's name and show it in the fix ("Pass e.g. claim_lease=30"); the CLI rewrites
# both to the flag, so the user reads the name they actually typed.
_FLAGS = {
    "batch_size": "--batch-size",
    "poll_interval": "--poll-interval",
    "claim_lease": "--claim-lease",
    "relay_id": "--relay-id",
}

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A failure the user can fix that is not a bad option: printed as ``Error: ...``, exit 1."""


def _env(name: str) -> str:
    return f"{ENV_PREFIX}{name}"


def _url_option(command: F) -> F:
    return click.option(
        "--url",
        envvar=_env("URL"),
        show_envvar=True,
        metavar="URL",
        help=f"Database URL, e.g. {URL_EXAMPLE} or sqlite:///path/to/app.db.",
    )(command)


def _publisher_help() -> str:
    # The broker lines come from BROKERS, so a new broker is listed by itself. ``\b`` stops click
    # from rewrapping a paragraph; its lines are kept short enough for an 80-column terminal.
    schemes: dict[str, list[str]] = {}
    for scheme, broker in BROKERS.items():
        schemes.setdefault(broker.extra, []).append(scheme)
    forms = {
        extra: "celery:module:app" if extra == "celery" else ", ".join(f"{s}://" for s in names)
        for extra, names in schemes.items()
    }
    width = max(len(form) for form in [*forms.values(), "module:attribute"])
    return "\n".join(
        [
            "Where messages go, one of:",
            "",
            "\b",
            f"{'stdout':<{width}}  one JSON line per message",
            f"{'module:attribute':<{width}}  a publisher object, class",
            f"{'':<{width}}  or function of yours",
            *(f"{form:<{width}}  broker [{extra}]" for extra, form in forms.items()),
            "",
            "\b",
            "A broker needs its [extra] installed, e.g.",
            'pip install "sqla-outbox[redis]" for redis://.',
            "",
            "Each broker's URL options: docs/brokers/.",
        ]
    )


def _lease_option(command: F) -> F:
    return click.option(
        "--claim-lease",
        type=float,
        default=DEFAULT_CLAIM_LEASE,
        show_default=True,
        envvar=_env("CLAIM_LEASE"),
        show_envvar=True,
        metavar="SECONDS",
        help="How long a claim stays its relay's; the same for every relay of a deployment.",
    )(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="sqla-outbox", prog_name="sqla-outbox")
def cli() -> None:
    """A transactional outbox for SQLAlchemy: relay committed jobs to a broker.

    Run `sqla-outbox demo` to see the whole flow on a throwaway SQLite database.
    """


# --- relay -------------------------------------------------------------------------------------


@cli.command()
@_url_option
@click.option(
    "--publisher",
    envvar=_env("PUBLISHER"),
    show_envvar=True,
    metavar="SPEC",
    help=_publisher_help(),
)
@click.option(
    "--batch-size",
    type=int,
    default=100,
    show_default=True,
    envvar=_env("BATCH_SIZE"),
    show_envvar=True,
    metavar="N",
    help="Rows claimed per pass.",
)
@click.option(
    "--poll-interval",
    type=float,
    default=0.2,
    show_default=True,
    envvar=_env("POLL_INTERVAL"),
    show_envvar=True,
    metavar="SECONDS",
    help="Pause between passes when nothing is due.",
)
@_lease_option
@click.option(
    "--relay-id",
    envvar=_env("RELAY_ID"),
    show_envvar=True,
    metavar="ID",
    show_default="relay-<uuid4>",
    help="Readable id shown in claims, logs and `status`.",
)
@click.option(
    "--poll-only",
    is_flag=True,
    envvar=_env("POLL_ONLY"),
    show_envvar=True,
    help="Do not LISTEN for commit notifications (PostgreSQL); poll every --poll-interval. "
    "Needed behind PgBouncer in transaction pooling mode.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Publish everything due, then exit (1 if a publish failed) instead of running on.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    envvar=_env("LOG_LEVEL"),
    show_envvar=True,
    help="Structured (logfmt) log lines go to stderr from this level up.",
)
@click.pass_context
def relay(
    ctx: click.Context,
    *,
    url: str | None,
    publisher: str | None,
    batch_size: int,
    poll_interval: float,
    claim_lease: float,
    relay_id: str | None,
    poll_only: bool,
    once: bool,
    log_level: str,
) -> int:
    """Publish committed outbox rows, in order, at least once.

    Runs until SIGINT or SIGTERM, which let the pass in flight finish and write its marks before
    the exit (status 0). With --once it publishes what is due and exits.
    """
    database_url = _require_url(ctx, url)
    if not publisher:
        raise click.UsageError(
            f"Missing option '--publisher'. Pass --publisher stdout (or module:attribute, or a "
            f"broker URL: see --help), or set {_env('PUBLISHER')}.",
            ctx,
        )
    # ``python -m`` puts the working directory on sys.path; a console script does not. Add it,
    # as application servers do, so --publisher myapp.publishers:publish works from the project.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target = resolve_publisher(publisher)
    except PublisherError as error:
        raise click.UsageError(str(error), ctx) from error
    engine = _engine(ctx, database_url)
    with _logging_to_stderr(log_level):
        outbox_relay = _build_relay(
            ctx,
            engine,
            target,
            batch_size=batch_size,
            poll_interval=poll_interval,
            claim_lease=claim_lease,
            relay_id=relay_id,
            poll_only=poll_only,
        )
        try:
            with _database_errors(database_url):
                outbox_relay.check()
            with _database_errors(database_url, "while relaying", _RETRY_FIX):
                result = outbox_relay.run(once=once)
            if once:
                log_event(
                    log,
                    logging.WARNING if result.failed else logging.INFO,
                    "relay.once_done",
                    relay=outbox_relay.relay_id,
                    claimed=result.claimed,
                    published=result.published,
                    failed=result.failed,
                )
            return 1 if result.failed else 0
        finally:
            outbox_relay.close()
            engine.dispose()


def _build_relay(
    ctx: click.Context,
    engine: Engine,
    publisher: PublisherLike,
    *,
    batch_size: int,
    poll_interval: float,
    claim_lease: float,
    relay_id: str | None,
    poll_only: bool,
) -> Relay:
    # The constructor is the one place these values are validated; the CLI only renames the
    # argument in its message to the flag.
    try:
        return Relay(
            engine,
            publisher,
            batch_size=batch_size,
            poll_interval=poll_interval,
            claim_lease=claim_lease,
            relay_id=relay_id,
            poll_only=poll_only,
        )
    except ConfigurationError as error:
        raise _flag_error(ctx, error) from error


def _flag_error(ctx: click.Context, error: ConfigurationError) -> click.UsageError:
    message = str(error)
    for name, flag in _FLAGS.items():
        if message.startswith(f"{name} "):
            message = message.replace(f"{name}=", f"{flag} ").replace(name, flag)
            if ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT:
                message = message.replace(flag, f"{flag} (from {_env(name.upper())})", 1)
            break
    return click.UsageError(message, ctx)


# --- status ------------------------------------------------------------------------------------


@dataclass
class RelayClaims:
    """Unpublished rows one relay holds, over all its live claims (fence tokens)."""

    relay_id: str
    claims: int
    rows_held: int
    claim_age_seconds: float
    lapsed: bool


@dataclass
class OutboxStatus:
    """What ``sqla-outbox status`` reports; ``--json`` prints exactly these fields."""

    url: str
    pending: int
    due: int
    oldest_pending_age_seconds: float | None
    failing: int
    claim_lease_seconds: float
    relays: list[RelayClaims] = field(default_factory=list)


@cli.command()
@_url_option
@_lease_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.pass_context
def status(ctx: click.Context, url: str | None, claim_lease: float, as_json: bool) -> int:
    """Show the backlog: pending and due rows, the oldest one's age, failures, live claims.

    A claim older than --claim-lease has lapsed: its relay is presumed dead and any relay may
    take those rows.
    """
    database_url = _require_url(ctx, url)
    try:
        lease = resolve_claim_lease(claim_lease)
    except ConfigurationError as error:
        raise _flag_error(ctx, error) from error
    engine = _engine(ctx, database_url)
    try:
        report = _collect_status(engine, database_url, lease)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(asdict(report), indent=2))
    else:
        click.echo(_status_table(report))
    return 0


def _collect_status(engine: Engine, url: URL, lease: dt.timedelta) -> OutboxStatus:
    dialect = engine.dialect.name
    with _database_errors(url):
        conn = engine.connect()
    with conn, _database_errors(url, "while reading the outbox"), raise_if_missing_table(engine):
        check_outbox_table(conn, STATUS_PRIVILEGES, needed_by="sqla-outbox status")
        if dialect == "postgresql":
            # Leases are measured on the database's clock; ages must be too.
            now: dt.datetime = conn.execute(sa.select(sa.func.now())).scalar_one()
            params: dict[str, Any] = {}
        else:
            now = dt.datetime.now(dt.timezone.utc)
            params = {"now": now}
        counts = conn.execute(queries.status_stmt(dialect), params).one()
        claims = conn.execute(queries.claims_stmt()).all()
    by_relay: dict[str, RelayClaims] = {}
    for token, held, claimed_at in claims:
        relay_id = str(token).rpartition(":")[0] or str(token)  # tokens: <relay_id>:<16 hex>
        age = (now - claimed_at).total_seconds()
        entry = by_relay.setdefault(relay_id, RelayClaims(relay_id, 0, 0, age, False))
        entry.claims += 1
        entry.rows_held += held
        entry.claim_age_seconds = round(max(entry.claim_age_seconds, age), 3)
        entry.lapsed = entry.lapsed or age > lease.total_seconds()
    oldest = counts.oldest_staged_at
    return OutboxStatus(
        url=hide_password(url),
        pending=counts.pending,
        due=counts.due,
        oldest_pending_age_seconds=None
        if oldest is None
        else round((now - oldest).total_seconds(), 3),
        failing=counts.failing,
        claim_lease_seconds=lease.total_seconds(),
        relays=list(by_relay.values()),
    )


def _status_table(report: OutboxStatus) -> str:
    age = report.oldest_pending_age_seconds
    lines = [
        f"Outbox at {report.url}",
        f"  pending (unpublished)     {report.pending}",
        f"  due now                   {report.due}",
        f"  oldest pending age        {'-' if age is None else _seconds(age)}",
        f"  with failed attempts      {report.failing}",
        "",
    ]
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


# --- demo --------------------------------------------------------------------------------------


@cli.command()
@click.option("--keep", is_flag=True, help="Keep the temporary SQLite database and say where.")
def demo(keep: bool) -> int:
    """The whole flow on a throwaway SQLite database: stage, roll back, relay, check.

    Needs no setup and no arguments; finishes in a couple of seconds.
    """
    from sqla_outbox.demo import run_demo  # noqa: PLC0415 - only this command needs it

    return run_demo(keep=keep)


# --- shared ------------------------------------------------------------------------------------


def _require_url(ctx: click.Context, url: str | None) -> URL:
    """The --url, checked before anything connects (see :mod:`sqla_outbox.preflight`)."""
    if not url:
        raise click.UsageError(
            f"Missing option '--url'. Pass --url {URL_EXAMPLE}, or set {_env('URL')}.", ctx
        )
    try:
        parsed = database_url(url, **_url_source(ctx))
    except ConfigurationError as error:
        raise click.UsageError(str(error), ctx) from error
    _refuse_missing_sqlite_file(parsed)
    return parsed


def _url_source(ctx: click.Context) -> dict[str, str]:
    # How the URL's messages name it: the flag, and the variable when it came from there.
    source = "--url"
    if ctx.get_parameter_source("url") is ParameterSource.ENVIRONMENT:
        source = f"--url (from {_env('URL')})"
    return {"source": source, "fix": f"Pass e.g. --url {URL_EXAMPLE}, or set {_env('URL')}."}


def _refuse_missing_sqlite_file(url: URL) -> None:
    # SQLite creates a missing file on connect; a typo in the path would then report "no outbox
    # table" in a brand-new empty database and leave the file behind.
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return
    if database.startswith("file:") or Path(database).exists():
        return
    raise CommandError(
        f"SQLite database file {database!r} does not exist. Check --url / {_env('URL')}; "
        "create the database and its outbox table first (alembic upgrade head)."
    )


def _engine(ctx: click.Context, url: URL) -> Engine:
    # A driver that is not installed is reported here, still before any connection.
    try:
        return engine_from_url(url, **_url_source(ctx), utc=True)
    except ConfigurationError as error:
        raise click.UsageError(str(error), ctx) from error


_CONNECT_FIX = f"Check --url / {_env('URL')} and that the server is running."
_SCHEMA_FIX = "Check that the outbox table matches this version (alembic upgrade head)."
_RETRY_FIX = (
    "The rows are safe in the outbox table; run the relay again once the database is healthy."
)


@contextmanager
def _database_errors(url: URL, doing: str | None = None, fix: str = _SCHEMA_FIX) -> Iterator[None]:
    """Turn a driver error into one sentence naming the URL (password hidden) and the fix.

    ``doing`` is ``None`` around the first connection: any error there is "cannot connect".
    """
    try:
        yield
    except DBAPIError as error:
        detail = str(error.orig if error.orig is not None else error).strip()
        first_line = detail.splitlines()[0].rstrip(".") if detail else type(error).__name__
        if doing is not None and is_permission_denied(error):
            # Start-up checked the privileges: a grant has been revoked since.
            raise CommandError(
                f"The database at {hide_password(url)} refused a statement {doing}: "
                f"{first_line}. Grant the role what sqla-outbox needs on the outbox table "
                f"(the relay: {', '.join(RELAY_PRIVILEGES)}; status: "
                f"{', '.join(STATUS_PRIVILEGES)})."
            ) from error
        if doing is None:
            raise CommandError(
                f"Cannot connect to {hide_password(url)}: {first_line}. {_CONNECT_FIX}"
            ) from error
        raise CommandError(
            f"The database at {hide_password(url)} failed {doing}: {first_line}. {fix}"
        ) from error


@contextmanager
def _logging_to_stderr(level: str) -> Iterator[None]:
    """Structured log lines from the ``sqla_outbox`` logger to stderr, for this command only."""
    logger = logging.getLogger("sqla_outbox")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    previous = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False  # a root handler configured by a wrapper would print every line twice
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous[0])
        logger.propagate = previous[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Click's standalone mode is off so that this function returns instead of calling
    ``sys.exit``: tests and wrappers call it in-process, and :class:`OutboxError` raised from
    anywhere below becomes one line on stderr here rather than a traceback.
    """
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="sqla-outbox",
            standalone_mode=False,
        )
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.Abort as error:
        click.echo("Aborted.", err=True)
        return 130 if isinstance(error.__cause__, KeyboardInterrupt) else 1
    except OutboxError as error:
        click.echo(f"Error: {error}", err=True)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
