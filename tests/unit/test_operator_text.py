"""What operators read: a failed row's error shortened in a table, a URL that does not parse,
a NUL refused with a reason that holds on every database."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

import sqla_outbox as outbox
from sqla_outbox.cli.common import ERROR_SHOWN, first_line
from sqla_outbox.errors import ArgumentValueError, ConfigurationError
from sqla_outbox.preflight import database_url

REFUSED = (
    "BrokerError: could not publish message 0190b1f4-7c1e-7a3b-9d2e-5f6a7b8c9d0e to "
    "amqp://guest:secret@rabbit.internal.example.com:5672/%2Fproduction?heartbeat=30: "
    "Connection refused by the broker"
)


def test_a_long_error_keeps_its_cause_and_loses_the_address() -> None:
    """The URL gives way (no credentials, path or query), the cause at the end stays."""
    shown = first_line(REFUSED)
    assert len(shown) <= ERROR_SHOWN
    assert shown.endswith(": Connection refused by the broker")
    assert "secret" not in shown and "heartbeat" not in shown


def test_a_short_error_is_shown_whole() -> None:
    assert first_line("RuntimeError: boom\n  Traceback ...") == "RuntimeError: boom"
    assert first_line(None) == "-"


def test_an_unclosed_ipv6_bracket_is_named_as_such() -> None:
    with pytest.raises(ConfigurationError, match=r"IPv6 host has no closing '\]'"):
        database_url("postgresql+psycopg://app@[::1/shop")
    with pytest.raises(ConfigurationError, match="port must be a whole number"):
        database_url("postgresql+psycopg://app@db:abc/shop")


def test_nul_is_refused_with_a_reason_that_holds_on_every_database() -> None:
    """On SQLite, which would store it, the refusal says why it is refused anyway."""
    engine = outbox.create_engine("sqlite://")
    with Session(engine) as session, pytest.raises(ConfigurationError) as info:
        outbox.enqueue(session, "job", {"text": "a\x00b"})
    assert "refuses NUL on every database" in str(info.value)
    engine.dispose()


def test_a_settings_error_is_spelled_by_each_front_end() -> None:
    """Python reads ``retry_max=1``; a command line spells the same settings as its flags, from
    the error's structure rather than by rewriting its text."""
    error = ArgumentValueError(
        "retry_max", "«retry_max» must be at least «retry_base», got «retry_max=1»."
    )
    assert str(error) == "retry_max must be at least retry_base, got retry_max=1."
    flags = error.render(lambda name, value: f"--{name}" + ("" if value is None else f" {value}"))
    assert flags == "--retry_max must be at least --retry_base, got --retry_max 1."
    assert isinstance(error, ConfigurationError) and error.argument == "retry_max"
