"""Structured log lines: one event name and ``key=value`` fields per line (logfmt).

The relay logs through the standard ``logging`` module (logger ``sqla_outbox``), so an
application's own handlers and formatters apply. Each record carries ``outbox_event`` and
``outbox_fields`` attributes for formatters that emit JSON; its message is already readable
logfmt, which is what :class:`LogfmtFormatter` (used by the CLI) prints after a timestamp.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

__all__ = ["LogfmtFormatter", "log_event", "logfmt"]


def _value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


def logfmt(fields: dict[str, Any]) -> str:
    """``key=value`` pairs, values quoted where they contain spaces, quotes or newlines."""
    return " ".join(f"{key}={_value(value)}" for key, value in fields.items() if value is not None)


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log ``event`` with ``fields`` as one logfmt line (skipped cheaply when not enabled)."""
    if not logger.isEnabledFor(level):
        return
    logger.log(
        level,
        "event=%s %s",
        event,
        logfmt(fields),
        extra={"outbox_event": event, "outbox_fields": fields},
    )


class LogfmtFormatter(logging.Formatter):
    """``time=<UTC ISO> level=<level> event=... key=value ...``, one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        line = f"time={stamp.isoformat(timespec='milliseconds')} level={record.levelname.lower()}"
        message = record.getMessage()
        if not hasattr(record, "outbox_event"):
            message = f"logger={record.name} msg={_value(message)}"
        line = f"{line} {message}"
        if record.exc_info:
            line = f"{line} exception={_value(self.formatException(record.exc_info))}"
        return line
