"""Structured log lines: one event name and ``key=value`` fields per line (logfmt or JSON).

The relay logs through the standard ``logging`` module (loggers under ``sqla_outbox``), so an
application's own handlers and formatters apply. A record logged with :func:`log_event` carries
``outbox_event`` (its event name) and ``outbox_fields`` (a dict) attributes for formatters of
their own; its message is already readable logfmt (``event=relay.dead_letter job=... id=...``).
The CLI prints records with one of two formatters (``sqla-outbox relay --log-format``):

* :class:`LogfmtFormatter` (default): ``time=... level=... event=... key=value ...``;
* :class:`JsonFormatter`: one JSON object per line, ``{"time": ..., "level": ..., "event": ...,
  "key": value, ...}``, every field a key of its own.

Both render a record that is not an event (``log.exception("...")`` from a library) as
``logger`` and ``msg``, and an exception as one ``exception`` field holding the traceback (a
quoted, escaped logfmt value; a JSON string), so a line never spans several lines. A field
whose value is ``None`` is left out of both.

**Per-pass debug lines.** A relay whose logger (``sqla_outbox.relay``) is enabled for DEBUG when
it is built subscribes :class:`PassLog`, which logs ``event=relay.pass`` after each pass that
claimed something: ``claimed``, ``published``, ``failed``, ``held_back``, ``handed_back``,
``dead``, ``outage`` and ``duration_ms`` (from the claim's return to the end of the pass). A
relay built with DEBUG off pays nothing for it; enabling DEBUG later does not add it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqla_outbox.observers import PassReport

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LogfmtFormatter",
    "PassLog",
    "describe_error",
    "error_line",
    "formatter",
    "log_event",
    "logfmt",
]

LOG_FORMATS = ("logfmt", "json")
"""What ``sqla-outbox relay --log-format`` accepts; the first is the default."""

_RESERVED = ("time", "level", "event")


def _value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


def logfmt(fields: dict[str, Any]) -> str:
    """``key=value`` pairs, values quoted where they contain spaces, quotes or newlines."""
    return " ".join(f"{key}={_value(value)}" for key, value in fields.items() if value is not None)


class _Logfmt:
    """``fields`` as :func:`logfmt`, rendered when a handler formats the record's message.

    A record's arguments are rendered only by ``getMessage()``: a handler that never formats
    (a counter, a filter that drops it, a formatter reading ``outbox_fields``) costs nothing
    here, as with ``logging``'s own ``%s`` arguments.
    """

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return logfmt(self.fields)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")


def describe_error(error: BaseException) -> str:
    """``Type: message``, or just ``Type`` for an error without one (``CancelledError()``): how
    every log line and ``last_error`` names an error.

    Whatever the error holds, the result is text every store keeps. A NUL or a lone surrogate
    in the message (binary in a response body, a broker's reply decoded with
    ``surrogateescape``) is written as its escape (``\\x00``, ``\\udc80``): PostgreSQL stores
    no NUL and UTF-8 encodes no surrogate. An error whose ``str()`` raises is named by its type.
    Either, left as it is, would fail the write-back of the pass that met it, its marks with it:
    the row would never be charged, so never dead-lettered, and every pass that claimed it would
    publish the rows before it again.
    """
    name = type(error).__name__
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not take the pass down with it
        return f"{name} (its str() raised)"
    if not text:
        return name
    if not text.isascii() or "\x00" in text:
        text = _UNSTORABLE.sub(_escaped, text)
    return f"{name}: {text}"


def error_line(error: BaseException) -> str:
    """The first line of :func:`describe_error`: a database or driver error in a log field
    (their messages go on with the SQL and a documentation link)."""
    return describe_error(error).splitlines()[0]


def log_event(
    logger: logging.Logger,
    level: int,
    event: str,
    *,
    exc_info: BaseException | bool | None = None,
    **fields: Any,
) -> None:
    """Log ``event`` with ``fields`` as one logfmt line (skipped cheaply when not enabled).

    ``exc_info`` (an exception, or ``True`` inside an ``except`` block) attaches a traceback,
    which both formatters render as an ``exception`` field.
    """
    if not logger.isEnabledFor(level):
        return
    logger.log(
        level,
        "event=%s %s",
        event,
        _Logfmt(fields),
        exc_info=exc_info,
        extra={"outbox_event": event, "outbox_fields": fields},
    )


def _stamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
    return moment.isoformat(timespec="milliseconds")


class LogfmtFormatter(logging.Formatter):
    """``time=<UTC ISO> level=<level> event=... key=value ...``, one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"time={_stamp(record)} level={record.levelname.lower()}"
        message = record.getMessage()
        if not hasattr(record, "outbox_event"):
            message = f"logger={record.name} msg={_value(message)}"
        line = f"{line} {message}"
        if record.exc_info:
            line = f"{line} exception={_value(self.formatException(record.exc_info))}"
        if record.stack_info:
            line = f"{line} stack={_value(self.formatStack(record.stack_info))}"
        return line


def _json_value(value: Any) -> Any:
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    return str(value)  # UUIDs, datetimes, URLs: as logfmt shows them


class JsonFormatter(logging.Formatter):
    """One JSON object per record and line: ``time`` (UTC ISO), ``level``, then ``event`` and
    each field of an event, or ``logger`` and ``msg`` for any other record; ``exception`` when
    the record carries a traceback.

    A field named like one of the leading keys (``time``, ``level``, ``event``) is written as
    ``field_<name>`` so it cannot overwrite them. Values JSON cannot hold (UUIDs, datetimes)
    are written as their text, as in logfmt.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _stamp(record), "level": record.levelname.lower()}
        event = getattr(record, "outbox_event", None)
        if event is None:
            line["logger"] = record.name
            line["msg"] = record.getMessage()
        else:
            line["event"] = str(event)
            fields = getattr(record, "outbox_fields", None) or {}
            for key, value in fields.items():
                if value is not None:
                    name = f"field_{key}" if key in _RESERVED else str(key)
                    line[name] = _json_value(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def formatter(name: str) -> logging.Formatter:
    """The formatter for a ``--log-format`` name (one of :data:`LOG_FORMATS`)."""
    if name == "json":
        return JsonFormatter()
    if name == "logfmt":
        return LogfmtFormatter()
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {name!r}.")


class PassLog:
    """A :class:`~sqla_outbox.observers.PassObserver`: one DEBUG ``event=relay.pass`` line per
    pass that claimed something (see the module docs)."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def pass_done(self, report: PassReport) -> None:
        """Log the pass."""
        outcome = report.outcome
        log_event(
            self._logger,
            logging.DEBUG,
            "relay.pass",
            relay=report.relay_id,
            claimed=len(report.claimed),
            published=len(outcome.published),
            failed=len(outcome.failed),
            held_back=len(outcome.held_back),
            handed_back=len(outcome.handed_back),
            dead=len(report.dead),
            outage=outcome.outage is not None,
            duration_ms=round(report.seconds * 1000, 3),
        )
