"""The ``sqla-outbox`` console script: ``relay``, ``status``, ``dead``, ``purge`` and ``demo``.

``relay`` runs a :class:`~sqla_outbox.Relay` in the foreground; ``status`` shows the backlog,
who holds it and which failed rows hold back others; ``dead list|retry|discard`` lets an operator
see and settle the dead letters (:mod:`sqla_outbox.dead_letters`); ``purge`` deletes old published
rows (:mod:`sqla_outbox.retention`); ``demo`` tells the whole story on a throwaway SQLite database.

Every option is also read from an environment variable (``SQLA_OUTBOX_URL``,
``SQLA_OUTBOX_PUBLISHER``, ...; ``--help`` lists them), so a container needs no command line.

Errors a user can cause print one sentence with the fix on stderr and exit non-zero: ``2`` for
a bad option (a malformed ``--url``, a database other than PostgreSQL, SQLite, MySQL or MariaDB,
MySQL or MariaDB for ``relay``, which does not run there yet, a driver that is not installed or is
asyncio-only, a publisher that cannot be imported), ``1`` for the rest (an unreachable database, a
missing table, a role without the privileges the command needs). The
URL and the table are checked before the command starts (:mod:`sqla_outbox.preflight`), so a
relay that cannot work exits at once instead of logging the same error forever. They never print
a traceback; a traceback means a bug in sqla-outbox. Database URLs are always shown with the
password hidden.

Exit codes of ``relay``: ``0`` after ``--once`` published everything due, or after SIGINT or
SIGTERM (the pass in flight finishes and its marks are written first); ``1`` if a publish failed
under ``--once`` (the message was charged an attempt and is retried after its backoff; the rest
still flowed) or the database cannot be used; ``2`` for a bad option. ``dead retry`` and ``dead
discard`` exit ``1`` when an id given is not a dead letter (after acting on those that are).
``status`` exits ``3`` when a ``--max-age`` or ``--max-dead`` threshold is crossed (after its
report, naming the threshold on stderr), so a cron job or a probe can tell an alert from ``1``,
an outbox it could not read.

``relay --metrics-port`` serves ``/metrics`` and ``/healthz`` beside the relay
(:mod:`sqla_outbox.serving`); ``--log-format json`` prints one JSON object per log line
(:mod:`sqla_outbox.logs`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from sqla_outbox import retention
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
from sqla_outbox.engines import hide_password
from sqla_outbox.errors import ConfigurationError, OutboxError, PublisherError
from sqla_outbox.logs import LOG_FORMATS, formatter, log_event
from sqla_outbox.metrics import PROMETHEUS_MISSING, prometheus_available
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
from sqla_outbox.retries import DEFAULT_MAX_PUBLISH_ATTEMPTS, DEFAULT_RETRY_BASE, DEFAULT_RETRY_MAX
from sqla_outbox.schema_errors import is_permission_denied, raise_if_missing_table
from sqla_outbox.settings import DEFAULT_CLAIM_LEASE, resolve_claim_lease
from sqla_outbox.stores.operating import operations_for

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
    "order": "--order",
    "max_publish_attempts": "--max-publish-attempts",
    "retry_base": "--retry-base",
    "retry_max": "--retry-max",
}
# An argument's name where it stands as a word (``retry_max=300``, ``order='key'``), never as part
# of another (``ordering key``) or of a flag already written (``--order``).
_ARGUMENT = re.compile(rf"(?<![\w-])({'|'.join(_FLAGS)})(?!\w)(=?)")
NEVER = "never"
"""What ``--max-publish-attempts`` takes for "retry for ever" (the library's ``None``)."""

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


class _AttemptsType(click.ParamType[int | None, Any]):
    """A whole number, or ``never`` (``None``: retry for ever); the Relay checks the range."""

    name = "attempts"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip()
        if text.lower() == NEVER:
            return None
        try:
            return int(text)
        except ValueError:
            self.fail(f"{value!r} is neither a whole number nor {NEVER!r}.", param, ctx)


class _DurationType(click.ParamType[dt.timedelta, Any]):
    """A duration: ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` (:func:`retention.parse_duration`)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.timedelta:
        if isinstance(value, dt.timedelta):
            return value
        try:
            return retention.parse_duration(str(value))
        except ConfigurationError as error:
            self.fail(str(error), param, ctx)


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
    "--order",
    default="key",
    show_default=True,
    envvar=_env("ORDER"),
    show_envvar=True,
    metavar="key|strict",
    help="key: a message waits only for the earlier messages of its transaction and its "
    "ordering key, everything else flows past a failure. strict: nothing is published after a "
    "failed message until it is.",
)
@click.option(
    "--overlap/--no-overlap",
    default=None,
    envvar=_env("OVERLAP"),
    show_envvar=True,
    help="Claim the next rows while a pass publishes. Default: on for the bundled brokers "
    "where it was measured to pay (docs/performance.md), off otherwise.",
)
@click.option(
    "--max-publish-attempts",
    type=_AttemptsType(),
    default=DEFAULT_MAX_PUBLISH_ATTEMPTS,
    show_default=True,
    envvar=_env("MAX_PUBLISH_ATTEMPTS"),
    show_envvar=True,
    metavar=f"N|{NEVER}",
    help=f"Failed publishes after which a message becomes a dead letter (see `sqla-outbox dead "
    f"--help`); '{NEVER}' retries it for ever.",
)
@click.option(
    "--retry-base",
    type=float,
    default=DEFAULT_RETRY_BASE,
    show_default=True,
    envvar=_env("RETRY_BASE"),
    show_envvar=True,
    metavar="SECONDS",
    help="After its n-th failed publish a message waits min(retry-base * 2^(n-1), retry-max) "
    "before it is tried again.",
)
@click.option(
    "--retry-max",
    type=float,
    default=DEFAULT_RETRY_MAX,
    show_default=True,
    envvar=_env("RETRY_MAX"),
    show_envvar=True,
    metavar="SECONDS",
    help="The longest wait between two tries of a message.",
)
@click.option(
    "--retain-published",
    type=_DurationType(),
    envvar=_env("RETAIN_PUBLISHED"),
    show_envvar=True,
    metavar="DURATION",
    help="While idle, delete rows published longer ago than this (90s, 15m, 12h, 7d, 2w), a "
    "bounded round at most once a minute. Default: keep them (see `sqla-outbox purge`). Not "
    "with --once, which never idles.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Publish everything due, then exit instead of running on: 1 if a publish failed (that "
    "message is retried after its backoff by the next run), else 0.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    envvar=_env("LOG_LEVEL"),
    show_envvar=True,
    help="Structured log lines go to stderr from this level up; debug adds one line per pass.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
    default=LOG_FORMATS[0],
    show_default=True,
    envvar=_env("LOG_FORMAT"),
    show_envvar=True,
    help="logfmt: time=... level=... event=... key=value. json: one JSON object per line, "
    "each field a key.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    envvar=_env("METRICS_PORT"),
    show_envvar=True,
    metavar="PORT",
    help="Serve /metrics (Prometheus) and /healthz (200 while the relay reaches the database, "
    'else 503) on this port. Needs pip install "sqla-outbox[prometheus]".',
)
@click.option(
    "--metrics-host",
    default="0.0.0.0",
    show_default=True,
    envvar=_env("METRICS_HOST"),
    show_envvar=True,
    metavar="HOST",
    help="Address --metrics-port binds: every interface by default, so Prometheus and "
    "Kubernetes probes from outside the container reach it; 127.0.0.1 keeps it local.",
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
    order: str,
    overlap: bool | None,
    max_publish_attempts: int | None,
    retry_base: float,
    retry_max: float,
    retain_published: dt.timedelta | None,
    once: bool,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> int:
    """Publish committed outbox rows, in order, at least once.

    Runs until SIGINT or SIGTERM, which let the pass in flight finish and write its marks before
    the exit (status 0). With --once it publishes what is due and exits.

    With --metrics-port, /healthz answers 200 while the relay has reached the database within
    claim-lease + max(poll-interval, 10) seconds, and 503 (with the reason) otherwise, including
    under --once (a drain, not a loop: scrape /metrics then, not /healthz).
    """
    database_url = _require_url(ctx, url)
    if metrics_port is not None and not prometheus_available():
        raise click.UsageError(f"--metrics-port: {PROMETHEUS_MISSING}", ctx)
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
    with _logging_to_stderr(log_level, log_format):
        outbox_relay = _build_relay(
            ctx,
            engine,
            target,
            batch_size=batch_size,
            poll_interval=poll_interval,
            claim_lease=claim_lease,
            relay_id=relay_id,
            poll_only=poll_only,
            order=order,
            overlap=overlap,
            max_publish_attempts=max_publish_attempts,
            retry_base=retry_base,
            retry_max=retry_max,
            retain_published=retain_published,
        )
        try:
            with _database_errors(database_url):
                outbox_relay.check()
            with (
                _serving(outbox_relay, metrics_host, metrics_port),
                _database_errors(database_url, "while relaying", _RETRY_FIX),
            ):
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
    order: str,
    max_publish_attempts: int | None,
    retry_base: float,
    retry_max: float,
    retain_published: dt.timedelta | None = None,
    overlap: bool | None = None,
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
            order=order,
            max_publish_attempts=max_publish_attempts,
            retry_base=retry_base,
            retry_max=retry_max,
            retain_published=retain_published,
            overlap=overlap,
        )
    except ConfigurationError as error:
        raise _flag_error(ctx, error) from error


def _flag_error(ctx: click.Context, error: ConfigurationError) -> click.UsageError:
    message = str(error)
    name = next((name for name in _FLAGS if message.startswith(f"{name} ")), None)
    if name is None:
        return click.UsageError(message, ctx)

    def flag(match: re.Match[str]) -> str:
        return _FLAGS[match.group(1)] + (" " if match.group(2) else "")

    message = _ARGUMENT.sub(flag, message)
    if name == "max_publish_attempts":
        message = message.replace("or None to", f"or {NEVER!r} to")
    if ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT:
        message = message.replace(_FLAGS[name], f"{_FLAGS[name]} (from {_env(name.upper())})", 1)
    return click.UsageError(message, ctx)


@contextmanager
def _serving(outbox_relay: Relay, host: str, port: int | None) -> Iterator[None]:
    """Serve /metrics and /healthz on ``host:port`` while the block runs (nothing without a
    port); a port that cannot be bound ends the command before the relay starts."""
    if port is None:
        yield
        return
    from sqla_outbox.serving import Endpoint  # noqa: PLC0415 - only --metrics-port needs it

    endpoint = Endpoint(outbox_relay, host=host, port=port)
    try:
        endpoint.start()
    except OSError as error:
        raise CommandError(
            f"Cannot serve /metrics and /healthz on {host}:{port}: {error.strerror or error}. "
            f"Pass another --metrics-port (or {_env('METRICS_PORT')}), or stop what listens there."
        ) from error
    bound_host, bound_port = endpoint.address
    log_event(
        log,
        logging.INFO,
        "relay.serving",
        relay=outbox_relay.relay_id,
        metrics=f"http://{bound_host}:{bound_port}/metrics",
        healthz=f"http://{bound_host}:{bound_port}/healthz",
    )
    try:
        yield
    finally:
        endpoint.stop()


# --- status ------------------------------------------------------------------------------------

THRESHOLD_CROSSED = 3
"""Exit code of ``status`` when a ``--max-age`` or ``--max-dead`` threshold is crossed."""

HOLDING_SHOWN = 10
"""Failed rows ``status`` lists (the first, in claim order); ``failing`` counts them all."""


@dataclass
class RelayClaims:
    """Unpublished rows one relay holds, over all its live claims (fence tokens)."""

    relay_id: str
    claims: int
    rows_held: int
    claim_age_seconds: float
    lapsed: bool


@dataclass
class HoldingRow:
    """A failed, unpublished row: it holds back the later rows of its transaction and key.

    ``state`` is ``dead`` (a dead letter: waits for ``sqla-outbox dead retry|discard``),
    ``backing_off`` (``retry_at`` is still ahead) or ``due`` (its backoff is over: the next
    claim retries it). Timestamps are ISO 8601 text.
    """

    id: str
    job: str
    queue: str
    ordering_key: str | None
    attempts: int
    state: str
    retry_at: str | None
    dead_at: str | None
    last_error: str | None


@dataclass
class OutboxStatus:
    """What ``sqla-outbox status`` reports; ``--json`` prints exactly these fields.

    ``due`` counts the rows a relay could claim now: not dead, not parked, past ``run_at`` and
    any retry backoff. ``oldest_pending_age_seconds`` is how long the longest-waiting due row
    has been due (since it was staged, or since its ``run_at`` if later; a row failing or dead
    counts, a row scheduled for later does not): what ``--max-age`` compares. ``backing_off``
    rows wait out a retry backoff; ``dead`` rows are dead letters; ``parked`` rows are held back
    behind a failed or dead row. ``holding`` lists the first :data:`HOLDING_SHOWN` failed rows
    (of ``failing``), in claim order.
    """

    url: str
    pending: int
    due: int
    oldest_pending_age_seconds: float | None
    failing: int
    backing_off: int
    dead: int
    parked: int
    claim_lease_seconds: float
    relays: list[RelayClaims] = field(default_factory=list)
    holding: list[HoldingRow] = field(default_factory=list)


@cli.command()
@_url_option
@_lease_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--max-age",
    type=click.FloatRange(min=0),
    envvar=_env("MAX_AGE"),
    show_envvar=True,
    metavar="SECONDS",
    help=f"Exit {THRESHOLD_CROSSED} if a due message has waited longer than this since it came "
    "due (since staged, or since its run_at if later; messages scheduled for later do not count).",
)
@click.option(
    "--max-dead",
    type=click.IntRange(min=0),
    envvar=_env("MAX_DEAD"),
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
            f"{_plural(report.dead, 'dead letter')}, over --max-dead {max_dead} "
            "(`sqla-outbox dead list` shows them)."
        )
    return crossed


def _collect_status(engine: Engine, url: URL, lease: dt.timedelta) -> OutboxStatus:
    with _outbox_transaction(
        engine,
        url,
        STATUS_PRIVILEGES,
        needed_by="sqla-outbox status",
        doing="while reading the outbox",
    ) as conn:
        # Leases and ages are measured on the clock that rules there (sqla_outbox.clock).
        now, counts, claims, holding = operations_for(engine.dialect.name).status(
            conn, HOLDING_SHOWN
        )
    by_relay: dict[str, RelayClaims] = {}
    for token, held, claimed_at in claims:
        relay_id = str(token).rpartition(":")[0] or str(token)  # tokens: <relay_id>:<16 hex>
        age = (now - claimed_at).total_seconds()
        entry = by_relay.setdefault(relay_id, RelayClaims(relay_id, 0, 0, age, False))
        entry.claims += 1
        entry.rows_held += held
        entry.claim_age_seconds = round(max(entry.claim_age_seconds, age), 3)
        entry.lapsed = entry.lapsed or age > lease.total_seconds()
    oldest = counts.oldest_due_at
    return OutboxStatus(
        url=hide_password(url),
        pending=counts.pending,
        due=counts.due,
        oldest_pending_age_seconds=None
        if oldest is None
        else round((now - oldest).total_seconds(), 3),
        failing=counts.failing,
        backing_off=counts.backing_off,
        dead=counts.dead,
        parked=counts.parked,
        claim_lease_seconds=lease.total_seconds(),
        relays=list(by_relay.values()),
        holding=[_holding_row(row, now) for row in holding],
    )


def _holding_row(row: Any, now: dt.datetime) -> HoldingRow:
    if row.dead_at is not None:
        state = "dead"
    elif row.retry_at is not None and row.retry_at > now:
        state = "backing_off"
    else:
        state = "due"
    return HoldingRow(
        id=str(row.id),
        job=row.job,
        queue=row.queue,
        ordering_key=row.ordering_key,
        attempts=row.attempts,
        state=state,
        retry_at=None if row.retry_at is None else row.retry_at.isoformat(),
        dead_at=None if row.dead_at is None else row.dead_at.isoformat(),
        last_error=row.last_error,
    )


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
        lines += _table(
            ["ID", "JOB", "ORDERING KEY", "ATTEMPTS", "STATE", "LAST ERROR"],
            [
                [
                    row.id,
                    row.job,
                    row.ordering_key or "-",
                    str(row.attempts),
                    states[row.state],
                    _first_line(row.last_error),
                ]
                for row in report.holding
            ],
        )
        if report.dead:
            lines.append("  Dead letters: see `sqla-outbox dead list`, then `dead retry|discard`.")
        lines.append("")
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


ERROR_SHOWN = 60
"""Characters of a ``last_error`` a table shows (its first line)."""


def _first_line(text: str | None, width: int = ERROR_SHOWN) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else "-"
    return line if len(line) <= width else line[: width - 1] + "…"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, indented by two; the last column is not padded."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=False)]
        return "  " + "  ".join([*padded, cells[-1]])

    return [line(header), *(line(row) for row in rows)]


# --- dead letters ------------------------------------------------------------------------------


@cli.group()
def dead() -> None:
    """List, retry or discard dead letters.

    A message becomes a dead letter after --max-publish-attempts failed publishes: no relay
    tries it again, and it holds back the later messages of its transaction and ordering key
    until it is retried (published again first, then what it held back) or discarded (never
    published; what it held back flows).
    """


@dead.command("list")
@_url_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object per dead letter per line."
)
@click.pass_context
def list_dead(ctx: click.Context, url: str | None, as_json: bool) -> int:
    """Show the dead letters, in publishing order.

    The table shows the first line of each last error; --json prints the whole message with
    attempts, last_error and dead_at.
    """
    database_url = _require_url(ctx, url)
    engine = _engine(ctx, database_url)
    try:
        with _outbox_transaction(
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
            _first_line(letter.last_error),
        ]
        for letter in letters
    ]
    header = ["ID", "JOB", "QUEUE", "ORDERING KEY", "ATTEMPTS", "DEAD AT", "LAST ERROR"]
    return "\n".join([f"{_plural(len(letters), 'dead letter')}:", *_table(header, rows)])


def _ids_argument(command: F) -> F:
    return click.argument("ids", nargs=-1, metavar="[ID]...")(command)


def _all_option(verb: str) -> Callable[[F], F]:
    return click.option("--all", "every", is_flag=True, help=f"{verb} every dead letter.")


@dead.command("retry")
@_url_option
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
        f"Retried {_plural(len(retried), 'dead letter')}; relays publish "
        f"{'it' if len(retried) == 1 else 'them'} before what "
        f"{'it' if len(retried) == 1 else 'they'} held back."
        if retried
        else "Retried 0 dead letters."
    )
    return _not_dead(ids, retried)


@dead.command("discard")
@_url_option
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
        f"Discarded {_plural(len(discarded), 'dead letter')}; "
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
    database_url = _require_url(ctx, url)
    engine = _engine(ctx, database_url)
    try:
        with _outbox_transaction(
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
        f"{_plural(len(missing), 'id')} given {'is' if len(missing) == 1 else 'are'} not a dead "
        f"letter (published, retried or discarded already, or never staged): "
        f"{', '.join(missing)}. `sqla-outbox dead list` shows the dead letters."
    )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# --- retention ---------------------------------------------------------------------------------

_PURGE_FIX = "The batches deleted before it stay deleted; run the purge again for the rest."


@cli.command("purge")
@_url_option
@click.option(
    "--older-than",
    type=_DurationType(),
    envvar=_env("OLDER_THAN"),
    show_envvar=True,
    metavar="DURATION",
    help="Delete the rows published longer ago than this: 90s, 15m, 12h, 7d or 2w.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=retention.DEFAULT_BATCH_SIZE,
    show_default=True,
    envvar=_env("PURGE_BATCH_SIZE"),
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
            f"{_env('OLDER_THAN')}.",
            ctx,
        )
    database_url = _require_url(ctx, url)
    engine = _engine(ctx, database_url)
    try:
        with _database_errors(database_url), engine.connect():
            pass
        with _database_errors(database_url, "while purging published rows", _PURGE_FIX):
            deleted = retention.purge(engine, older_than=older_than, batch_size=batch_size)
    finally:
        engine.dispose()
    click.echo(
        f"Purged {_plural(deleted, 'published row')} older than "
        f"{retention.format_duration(older_than)}."
    )
    return 0


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


@contextmanager
def _outbox_transaction(
    engine: Engine, url: URL, privileges: Sequence[str], *, needed_by: str, doing: str
) -> Iterator[Connection]:
    """A transaction on ``engine`` after the start-up checks (table, ``privileges``, version);
    database errors become one sentence: "cannot connect" on connecting, ``doing`` after."""
    with _database_errors(url):
        conn = engine.connect()
    with conn, _database_errors(url, doing), raise_if_missing_table(engine), conn.begin():
        check_outbox_table(conn, privileges, needed_by=needed_by)
        yield conn


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
def _logging_to_stderr(level: str, log_format: str = LOG_FORMATS[0]) -> Iterator[None]:
    """Structured log lines (``log_format``: logfmt or json, see :mod:`sqla_outbox.logs`) from
    the ``sqla_outbox`` logger to stderr, for this command only."""
    logger = logging.getLogger("sqla_outbox")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format.lower()))
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
