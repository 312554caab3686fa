"""Structured logs: logfmt and JSON lines, the per-pass DEBUG line, and ``--log-format``.

Every record keeps its fields in both formats: an event's fields become ``key=value`` pairs or
JSON keys, a record that is not an event keeps its logger and message, and a traceback stays on
the record's one line.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine
from support import MakeRelay, run_cli, stage, stage_inputs, url_of

from sqla_outbox.logs import JsonFormatter, LogfmtFormatter, log_event, logfmt
from sqla_outbox.message import OutboxMessage

HELPERS = "tests.publishers_for_tests"


def record(
    event: str | None = None, *, exc: BaseException | None = None, **fields: Any
) -> logging.LogRecord:
    """A record as ``log_event`` makes it (or a plain one without ``event``)."""
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    if event is None:
        return logging.LogRecord(
            "sqla_outbox.relay", logging.ERROR, __file__, 1, "closing %s failed", ("x",), exc_info
        )
    made = logging.LogRecord(
        "sqla_outbox.relay",
        logging.WARNING,
        __file__,
        1,
        "event=%s %s",
        (event, logfmt(fields)),
        exc_info,
    )
    made.outbox_event = event
    made.outbox_fields = fields
    return made


def raised() -> BaseException:
    try:
        raise RuntimeError("broker said no\nsecond line")
    except RuntimeError as error:
        return error


# --- the formatters ----------------------------------------------------------------------------


def test_json_lines_carry_time_level_event_and_every_field() -> None:
    """An event becomes one JSON object: ``time`` (UTC, milliseconds), ``level``, ``event``,
    then each field with its JSON type (UUIDs as text); ``None`` fields are left out, as in
    logfmt."""
    message_id = uuid.uuid4()
    line = JsonFormatter().format(
        record(
            "relay.dead_letter",
            id=message_id,
            job="charge",
            attempts=3,
            dead=True,
            retry_in=None,
            error='said "no"',
        )
    )
    assert "\n" not in line
    parsed = json.loads(line)
    assert list(parsed)[:3] == ["time", "level", "event"]
    assert parsed["time"].endswith("+00:00") and parsed["level"] == "warning"
    assert parsed["event"] == "relay.dead_letter"
    assert parsed["id"] == str(message_id)
    assert (parsed["job"], parsed["attempts"], parsed["dead"]) == ("charge", 3, True)
    assert parsed["error"] == 'said "no"'
    assert "retry_in" not in parsed


def test_json_keeps_logger_and_message_of_other_records_and_the_traceback() -> None:
    """A record that is not an event keeps ``logger`` and ``msg``; a traceback is one
    ``exception`` string, so the line stays one line."""
    line = JsonFormatter().format(record(exc=raised()))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["logger"] == "sqla_outbox.relay" and parsed["msg"] == "closing x failed"
    assert "Traceback" in parsed["exception"] and "broker said no" in parsed["exception"]


def test_json_fields_cannot_overwrite_the_leading_keys() -> None:
    """A field named ``level`` (or ``time``, ``event``) is written as ``field_level``."""
    parsed = json.loads(JsonFormatter().format(record("custom.event", level="high")))
    assert parsed["level"] == "warning" and parsed["field_level"] == "high"


def test_logfmt_renders_a_traceback_on_the_same_line() -> None:
    """logfmt keeps an event's fields and puts a traceback in one quoted ``exception`` value."""
    line = LogfmtFormatter().format(record("relay.unexpected_error", exc=raised(), relay="r1"))
    assert "\n" not in line
    assert ' level=warning event=relay.unexpected_error relay=r1 exception="Traceback' in line
    assert "broker said no\\nsecond line" in line


def test_log_event_attaches_an_exception(caplog: pytest.LogCaptureFixture) -> None:
    """``log_event(..., exc_info=error)`` keeps the fields and attaches the traceback."""
    logger = logging.getLogger("sqla_outbox.test_logs")
    caplog.set_level(logging.INFO, logger="sqla_outbox")
    log_event(logger, logging.ERROR, "thing.failed", exc_info=raised(), relay="r1")
    [made] = [r for r in caplog.records if getattr(r, "outbox_event", None) == "thing.failed"]
    assert made.outbox_fields == {"relay": "r1"}  # type: ignore[attr-defined]
    assert made.exc_info is not None and "broker said no" in str(made.exc_info[1])


def test_log_event_renders_its_fields_only_when_a_handler_formats_it() -> None:
    """The record's message is the event's logfmt line, rendered by ``getMessage()``: logging
    the event does not format its fields for a handler that never asks (a failing drain logs
    one event per failure)."""

    class Loud:
        rendered = 0

        def __str__(self) -> str:
            Loud.rendered += 1
            return "loud value"

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    logger = logging.getLogger("sqla_outbox.test_logs.lazy")
    keep = Keep()
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # pytest's own capture formats every record it sees
    try:
        log_event(logger, logging.WARNING, "thing.done", x=Loud(), skipped=None)
    finally:
        logger.removeHandler(keep)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    [made] = keep.records
    assert Loud.rendered == 0
    assert made.getMessage() == 'event=thing.done x="loud value"'
    assert Loud.rendered == 1


# --- the per-pass DEBUG line -------------------------------------------------------------------


def refuse_flagged(message: OutboxMessage) -> None:
    if isinstance(message.input, dict) and message.input.get("fail"):
        raise RuntimeError("refused")


def pass_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        r.outbox_fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "outbox_event", None) == "relay.pass"
    ]


def test_a_relay_built_with_debug_logs_each_pass(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """With the relay's logger at DEBUG when it is built, each pass that claimed something logs
    ``event=relay.pass`` at DEBUG with what became of the claim and how long it took."""
    caplog.set_level(logging.DEBUG, logger="sqla_outbox")
    stage_inputs(pg_engine, "charge", [{"fail": True}, {"n": 1}], queue="q")  # one transaction
    stage(pg_engine, "emails", 2)
    relay = make_relay(pg_engine, refuse_flagged, batch_size=10, relay_id="debugged")
    relay.drain()
    [line] = pass_lines(caplog)
    assert line["relay"] == "debugged"
    counts = {key: line[key] for key in ("claimed", "published", "failed", "held_back", "dead")}
    assert counts == {"claimed": 4, "published": 2, "failed": 1, "held_back": 1, "dead": 0}
    assert (line["handed_back"], line["outage"]) == (0, False)
    assert line["duration_ms"] >= 0
    [made] = [r for r in caplog.records if getattr(r, "outbox_event", None) == "relay.pass"]
    assert made.levelno == logging.DEBUG


def test_a_relay_built_without_debug_logs_no_pass_lines(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay built while DEBUG is off does not subscribe the pass line: it pays nothing for it,
    even if DEBUG is switched on later."""
    caplog.set_level(logging.INFO, logger="sqla_outbox")
    relay = make_relay(pg_engine, refuse_flagged)
    caplog.set_level(logging.DEBUG, logger="sqla_outbox")
    stage(pg_engine, "emails", 2)
    assert relay.drain().published == 2
    assert pass_lines(caplog) == []


# --- the command line --------------------------------------------------------------------------


def json_lines(stderr: str) -> list[dict[str, Any]]:
    lines = stderr.splitlines()
    assert lines, "no log lines"
    return [json.loads(line) for line in lines]


def test_relay_log_format_json_prints_one_json_object_per_line(engine: Engine) -> None:
    """``relay --log-format json`` (here at debug) writes only JSON lines to stderr, each with
    time, level and event and the event's fields: the pass line, the dead letter's warning with
    its message fields, and the end of the ``--once`` run."""
    [failing] = stage_inputs(engine, "charge", [{"fail": True}], queue="invoices")
    stage(engine, "emails", 2)
    result = run_cli(
        "relay",
        "--once",
        "--publisher",
        f"{HELPERS}:fail_on_flag",
        "--max-publish-attempts",
        "1",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        url=url_of(engine),
    )
    assert result.returncode == 1, result.stderr
    lines = json_lines(result.stderr)
    assert all({"time", "level", "event"} <= set(line) for line in lines), lines
    by_event = {line["event"]: line for line in lines}
    dead = by_event["relay.dead_letter"]
    assert dead["level"] == "warning"
    assert (dead["id"], dead["job"], dead["queue"]) == (str(failing.id), "charge", "invoices")
    assert dead["attempts"] == 1 and "broker rejected" in dead["error"]
    assert by_event["relay.pass"]["published"] == 2
    assert by_event["relay.once_done"]["failed"] is True


def test_log_format_comes_from_the_environment_and_defaults_to_logfmt(engine: Engine) -> None:
    """``SQLA_OUTBOX_LOG_FORMAT=json`` selects JSON; without it the lines are logfmt."""
    stage(engine, "emails", 1)
    as_json = run_cli(
        "relay", "--once", "--publisher", "stdout", url=url_of(engine), log_format="json"
    )
    assert as_json.returncode == 0, as_json.stderr
    assert json_lines(as_json.stderr)[-1]["event"] == "relay.once_done"

    stage(engine, "emails", 1)
    default = run_cli("relay", "--once", "--publisher", "stdout", url=url_of(engine))
    assert default.returncode == 0, default.stderr
    last = default.stderr.splitlines()[-1]
    assert last.startswith("time=") and " event=relay.once_done " in last


def test_an_unknown_log_format_is_a_bad_option(engine: Engine) -> None:
    """``--log-format xml`` exits 2 naming the choices."""
    result = run_cli(
        "relay", "--once", "--publisher", "stdout", "--log-format", "xml", url=url_of(engine)
    )
    assert result.returncode == 2
    assert "json" in result.stderr and "logfmt" in result.stderr
