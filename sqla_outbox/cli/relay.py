"""``sqla-outbox relay``: a :class:`~sqla_outbox.Relay` in the foreground, configured from its
options (or their environment variables), serving ``/metrics`` and ``/healthz`` on request.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import OperationalError

from sqla_outbox.cli.common import (
    LOG_LEVELS,
    NEVER,
    RETRY_FIX,
    CommandError,
    DurationType,
    database_errors,
    engine_for,
    env,
    flag_error,
    lease_option,
    logging_to_stderr,
    require_url,
    url_option,
)
from sqla_outbox.cli.progress import PassProgress, Progress
from sqla_outbox.engines import hide_password
from sqla_outbox.errors import ConfigurationError, PublisherError
from sqla_outbox.logs import LOG_FORMATS, error_line, log_event
from sqla_outbox.metrics import PROMETHEUS_MISSING, prometheus_available
from sqla_outbox.publishers import PublisherLike
from sqla_outbox.publishers.loader import resolve_publisher
from sqla_outbox.publishers.routing import Router
from sqla_outbox.publishers.schemes import BROKERS
from sqla_outbox.relay import Relay
from sqla_outbox.retries import DEFAULT_MAX_PUBLISH_ATTEMPTS, DEFAULT_RETRY_BASE, DEFAULT_RETRY_MAX
from sqla_outbox.schema_errors import is_unreachable
from sqla_outbox.settings import DEFAULT_BATCH_SIZE, DEFAULT_POLL_INTERVAL

__all__ = ["relay"]

log = logging.getLogger("sqla_outbox.cli")


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
            "Each broker's URL options: the Brokers pages of the documentation.",
        ]
    )


def _publisher(ctx: click.Context, spec: str | None, routes: tuple[str, ...]) -> PublisherLike:
    """The publisher ``--publisher`` and ``--route`` name: a :class:`Router` when routes are
    given (``spec`` its default), else ``spec``'s."""
    try:
        default = None if spec is None else resolve_publisher(spec)
        if not routes:
            assert default is not None  # the caller required one of them
            return default
        by_queue: dict[str, PublisherLike] = {}
        for route in routes:
            queue, equals, target = route.partition("=")
            if not equals or not queue.strip() or not target.strip():
                raise click.BadParameter(
                    f"{route!r} is not QUEUE=SPEC. Pass e.g. --route emails=redis://localhost "
                    "(the queue name, '=', then any --publisher form).",
                    ctx,
                    param_hint="'--route'",
                )
            if queue.strip() in by_queue:
                raise click.BadParameter(
                    f"queue {queue.strip()!r} is routed twice. Give each queue one --route.",
                    ctx,
                    param_hint="'--route'",
                )
            by_queue[queue.strip()] = resolve_publisher(target)
        return Router(by_queue, default=default)
    except PublisherError as error:
        raise click.UsageError(str(error), ctx) from error


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


@click.command()
@url_option
@click.option(
    "--publisher",
    envvar=env("PUBLISHER"),
    show_envvar=True,
    metavar="SPEC",
    help=_publisher_help(),
)
@click.option(
    "--route",
    "routes",
    multiple=True,
    envvar=env("ROUTE"),
    show_envvar=True,
    metavar="QUEUE=SPEC",
    help="Send the messages of QUEUE to the publisher SPEC (any --publisher form); repeatable. "
    "--publisher then takes every other queue; without it, a message of a queue with no route "
    "is a failed publish naming its queue. Order per transaction and key holds across routes.",
)
@click.option(
    "--batch-size",
    type=int,
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    envvar=env("BATCH_SIZE"),
    show_envvar=True,
    metavar="N",
    help="Rows claimed per pass.",
)
@click.option(
    "--poll-interval",
    type=float,
    default=DEFAULT_POLL_INTERVAL,
    show_default=True,
    envvar=env("POLL_INTERVAL"),
    show_envvar=True,
    metavar="SECONDS",
    help="Pause between passes when nothing is due.",
)
@lease_option
@click.option(
    "--relay-id",
    envvar=env("RELAY_ID"),
    show_envvar=True,
    metavar="ID",
    show_default="relay-<uuid4>",
    help="Readable id shown in claims, logs and `status`.",
)
@click.option(
    "--poll-only",
    is_flag=True,
    envvar=env("POLL_ONLY"),
    show_envvar=True,
    help="Do not LISTEN for commit notifications (PostgreSQL); poll every --poll-interval. "
    "Needed behind PgBouncer in transaction pooling mode.",
)
@click.option(
    "--order",
    default="key",
    show_default=True,
    envvar=env("ORDER"),
    show_envvar=True,
    metavar="key|strict",
    help="key: a message waits only for the earlier messages of its transaction and its "
    "ordering key, everything else flows past a failure. strict: nothing is published after a "
    "failed message until it is.",
)
@click.option(
    "--overlap/--no-overlap",
    default=None,
    envvar=env("OVERLAP"),
    show_envvar=True,
    help="Claim the next rows while a pass publishes. Default: on for the bundled brokers "
    "where it was measured to pay (the documentation's Performance page), off otherwise.",
)
@click.option(
    "--max-publish-attempts",
    type=_AttemptsType(),
    default=DEFAULT_MAX_PUBLISH_ATTEMPTS,
    show_default=True,
    envvar=env("MAX_PUBLISH_ATTEMPTS"),
    show_envvar=True,
    metavar=f"N|{NEVER}",
    help=f"Failed publishes after which a message becomes a dead letter (see `sqla-outbox dead "
    f"--help`); '{NEVER}' retries it for ever. Not the message's max_attempts, which is for the "
    "consumer (how often the job may run) and only carried.",
)
@click.option(
    "--retry-base",
    type=float,
    default=DEFAULT_RETRY_BASE,
    show_default=True,
    envvar=env("RETRY_BASE"),
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
    envvar=env("RETRY_MAX"),
    show_envvar=True,
    metavar="SECONDS",
    help="The longest wait between two tries of a message.",
)
@click.option(
    "--retain-published",
    type=DurationType(),
    envvar=env("RETAIN_PUBLISHED"),
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
    envvar=env("LOG_LEVEL"),
    show_envvar=True,
    help="Structured log lines go to stderr from this level up; debug adds one line per pass.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
    default=LOG_FORMATS[0],
    show_default=True,
    envvar=env("LOG_FORMAT"),
    show_envvar=True,
    help="logfmt: time=... level=... event=... key=value. json: one JSON object per line, "
    "each field a key.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    envvar=env("METRICS_PORT"),
    show_envvar=True,
    metavar="PORT",
    help="Serve /metrics (Prometheus) and /healthz (200 while the relay reaches the database, "
    'else 503) on this port. Needs pip install "sqla-outbox[prometheus]".',
)
@click.option(
    "--metrics-host",
    default="0.0.0.0",
    show_default=True,
    envvar=env("METRICS_HOST"),
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
    routes: tuple[str, ...],
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
    database_url = require_url(ctx, url)
    if metrics_port is not None and not prometheus_available():
        raise click.UsageError(f"--metrics-port: {PROMETHEUS_MISSING}", ctx)
    if not publisher and not routes:
        raise click.UsageError(
            f"Missing option '--publisher'. Pass --publisher stdout (or module:attribute, or a "
            f"broker URL: see --help), or set {env('PUBLISHER')}; or route queues with "
            "--route QUEUE=SPEC.",
            ctx,
        )
    # ``python -m`` puts the working directory on sys.path; a console script does not. Add it,
    # as application servers do, so --publisher myapp.publishers:publish works from the project.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    target = _publisher(ctx, publisher, routes)
    engine = engine_for(ctx, database_url)
    with logging_to_stderr(log_level, log_format):
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
            with _serving(outbox_relay, metrics_host, metrics_port):
                if not _check_once_reachable(outbox_relay, database_url, once=once):
                    return 0  # stopped by a signal while waiting for the database
                with database_errors(database_url, "while relaying", RETRY_FIX):
                    progress = _drain_progress(outbox_relay) if once else None
                    try:
                        result = outbox_relay.run(once=once)
                    finally:
                        if progress is not None:
                            progress.finish()
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


def _drain_progress(outbox_relay: Relay) -> Progress:
    """Progress of a ``--once`` drain, out of the rows pending when it starts (dead letters and
    rows not yet due count there, so the share may stop short of 100%)."""
    progress = Progress("relay.progress", "publishing", "messages", outbox_relay.pending())
    outbox_relay.observe(PassProgress(progress))
    return progress


def _check_once_reachable(outbox_relay: Relay, url: URL, *, once: bool) -> bool:
    """The table's checks before the first pass, once the database can be reached; ``False``
    if SIGINT or SIGTERM came first.

    A database that cannot be reached yet (a server starting or failing over, a connection
    killed during start-up) is waited for, with the backoff the relay's loop uses when one goes
    away later, each attempt logged as ``relay.database_unavailable`` (``/healthz`` answers 503
    meanwhile): a supervisor that starts the relay with the database gets a relay, not a
    restart loop. A server that answered and refused (bad credentials, no such database), a
    missing or older table and missing privileges end the command at once (exit 1): waiting
    would not fix them. ``--once``, a one-off drain, does not wait either.
    """
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stop.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    backoff = outbox_relay.poll_interval
    try:
        with database_errors(url):
            while True:
                try:
                    outbox_relay.check()
                    return True
                except OperationalError as error:
                    if once or not is_unreachable(error):
                        raise
                    log_event(
                        log,
                        logging.WARNING,
                        "relay.database_unavailable",
                        relay=outbox_relay.relay_id,
                        url=hide_password(url),
                        retry_in=round(backoff, 3),
                        error=error_line(error),
                    )
                if stop.wait(backoff):
                    return False
                backoff = min(backoff * 2, outbox_relay.max_backoff)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
        raise flag_error(ctx, error) from error


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
            f"Pass another --metrics-port (or {env('METRICS_PORT')}), or stop what listens there."
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
