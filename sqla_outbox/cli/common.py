"""What every command shares: the environment variables, the ``--url`` and ``--claim-lease``
options, and the turning of a bad URL or a database error into one sentence with its fix.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from sqla_outbox import retention
from sqla_outbox.engines import hide_password
from sqla_outbox.errors import ArgumentValueError, ConfigurationError
from sqla_outbox.logs import LOG_FORMATS, formatter
from sqla_outbox.preflight import (
    RELAY_PRIVILEGES,
    STATUS_PRIVILEGES,
    check_outbox_table,
    database_url,
    engine_from_url,
)
from sqla_outbox.schema_errors import is_permission_denied, raise_if_missing_table
from sqla_outbox.settings import DEFAULT_CLAIM_LEASE

__all__ = [
    "ENV_PREFIX",
    "LOG_LEVELS",
    "NEVER",
    "RETRY_FIX",
    "URL_EXAMPLE",
    "CommandError",
    "DurationType",
    "database_errors",
    "engine_for",
    "env",
    "first_line",
    "flag_error",
    "lease_option",
    "logging_to_stderr",
    "outbox_transaction",
    "plural",
    "require_url",
    "table",
    "url_option",
]


ENV_PREFIX = "SQLA_OUTBOX_"
URL_EXAMPLE = "postgresql+psycopg://user:password@host/dbname"
LOG_LEVELS = ("debug", "info", "warning", "error")

# Relay constructor argument -> the CLI option that feeds it: the library's messages about a
# setting (ArgumentValueError) are spelled with the flag, so the user reads the name they typed.
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
NEVER = "never"
"""What ``--max-publish-attempts`` takes for "retry for ever" (the library's ``None``)."""

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A failure the user can fix that is not a bad option: printed as ``Error: ...``, exit 1."""


def env(name: str) -> str:
    """The environment variable that sets option ``name``: one prefix, so ``env | grep`` finds
    every setting of a container."""
    return f"{ENV_PREFIX}{name}"


def url_option(command: F) -> F:
    """``--url`` (or ``SQLA_OUTBOX_URL``), the same on every command that reads the outbox."""
    return click.option(
        "--url",
        envvar=env("URL"),
        show_envvar=True,
        metavar="URL",
        help=f"Database URL, e.g. {URL_EXAMPLE} or sqlite:///path/to/app.db.",
    )(command)


def lease_option(command: F) -> F:
    """``--claim-lease``: ``relay`` and ``status`` must agree on it, so both read the same option
    and variable."""
    return click.option(
        "--claim-lease",
        type=float,
        default=DEFAULT_CLAIM_LEASE,
        show_default=True,
        envvar=env("CLAIM_LEASE"),
        show_envvar=True,
        metavar="SECONDS",
        help="How long a claim stays its relay's; the same for every relay of a deployment.",
    )(command)


class DurationType(click.ParamType[dt.timedelta, Any]):
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


def flag_error(ctx: click.Context, error: ConfigurationError) -> click.UsageError:
    """The library's message for a bad setting, with each setting it names spelled as the flag
    the user typed (and, for the one at fault, the variable it came from, if it did).

    A :class:`~sqla_outbox.errors.ArgumentValueError` says which settings its message names and
    where; any other error is shown as it is.
    """
    if not isinstance(error, ArgumentValueError):
        return click.UsageError(str(error), ctx)
    source = ""
    if error.argument in _FLAGS and (
        ctx.get_parameter_source(error.argument) is ParameterSource.ENVIRONMENT
    ):
        source = f" (from {env(error.argument.upper())})"

    def spell(name: str, value: str | None) -> str:
        flag = _FLAGS.get(name, name)
        if name == error.argument and value is None:
            flag += source
        if value is None:
            return flag
        if name == "max_publish_attempts" and value == "None":
            return f"{flag} {NEVER}"
        return f"{flag} {value.strip(chr(39))}"

    return click.UsageError(error.render(spell), ctx)


def require_url(ctx: click.Context, url: str | None) -> URL:
    """The --url, checked before anything connects (see :mod:`sqla_outbox.preflight`)."""
    if not url:
        raise click.UsageError(
            f"Missing option '--url'. Pass --url {URL_EXAMPLE}, or set {env('URL')}.", ctx
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
        source = f"--url (from {env('URL')})"
    return {"source": source, "fix": f"Pass e.g. --url {URL_EXAMPLE}, or set {env('URL')}."}


def _refuse_missing_sqlite_file(url: URL) -> None:
    # SQLite creates a missing file on connect; a typo in the path would then report "no outbox
    # table" in a brand-new empty database and leave the file behind.
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return
    if database.startswith("file:") or Path(database).exists():
        return
    raise CommandError(
        f"SQLite database file {database!r} does not exist. Check --url / {env('URL')}; "
        "create the database and its outbox table first (alembic upgrade head)."
    )


def engine_for(ctx: click.Context, url: URL) -> Engine:
    # A driver that is not installed is reported here, still before any connection.
    try:
        return engine_from_url(url, **_url_source(ctx), utc=True)
    except ConfigurationError as error:
        raise click.UsageError(str(error), ctx) from error


@contextmanager
def outbox_transaction(
    engine: Engine, url: URL, privileges: Sequence[str], *, needed_by: str, doing: str
) -> Iterator[Connection]:
    """A transaction on ``engine`` after the start-up checks (table, ``privileges``, version);
    database errors become one sentence: "cannot connect" on connecting, ``doing`` after."""
    with database_errors(url):
        conn = engine.connect()
    with conn, database_errors(url, doing), raise_if_missing_table(engine), conn.begin():
        check_outbox_table(conn, privileges, needed_by=needed_by)
        yield conn


_CONNECT_FIX = f"Check --url / {env('URL')} and that the server is running."
_SCHEMA_FIX = "Check that the outbox table matches this version (alembic upgrade head)."
RETRY_FIX = (
    "The rows are safe in the outbox table; run the relay again once the database is healthy."
)


@contextmanager
def database_errors(url: URL, doing: str | None = None, fix: str = _SCHEMA_FIX) -> Iterator[None]:
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
def logging_to_stderr(level: str, log_format: str = LOG_FORMATS[0]) -> Iterator[None]:
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


ERROR_SHOWN = 60
"""Characters of a ``last_error`` a table shows (its first line)."""


_URL_IN_TEXT = re.compile(r"\b([a-z][a-z0-9+.-]*)://(?:[^@/\s]*@)?([^/?#\s'\"]+)([^\s'\"]*)")


def first_line(text: str | None, width: int = ERROR_SHOWN) -> str:
    """The first line of ``text``, fitted to ``width``: a traceback in ``last_error`` keeps a
    table readable.

    A broker's error names the address, then the reason ("... to redis://host:6379/0?...:
    Connection refused"), so what gives way is the address, not the reason: each URL is
    shortened to its scheme and host (credentials, path and query dropped), and a line with a
    URL still too long keeps its start and its end, cut in the middle. Any other line keeps its
    start.
    """
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else "-"
    if len(line) <= width:
        return line
    shortened, urls = _URL_IN_TEXT.subn(_short_url, line)
    if len(shortened) <= width:
        return shortened
    if not urls:
        return line[: width - 1] + "…"
    head = width // 3
    return shortened[:head] + "…" + shortened[len(shortened) - (width - head - 1) :]


def _short_url(url: re.Match[str]) -> str:
    """``scheme://host[:port]``, then ``/…`` if a path or query followed; punctuation that
    ended the sentence after the URL is kept."""
    whole = url[2] + url[3]
    end = whole.rstrip(":,;.)")
    host, rest = end[: len(url[2])], end[len(url[2]) :]
    return f"{url[1]}://{host}{'/…' if rest.strip('/') else ''}{whole[len(end) :]}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, indented by two; the last column is not padded."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=False)]
        return "  " + "  ".join([*padded, cells[-1]])

    return [line(header), *(line(row) for row in rows)]


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, with an ``s`` unless there is one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
