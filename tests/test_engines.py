"""``sqla_outbox.engines``: the engine fixes the outbox applies to engines it owns."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from sqlalchemy import URL, Engine, text

import sqla_outbox as outbox
from sqla_outbox.engines import create_engine, hide_password, use_utc_sessions


def test_utc_sessions_on_postgresql(pg_url: URL) -> None:
    """Every new session is in UTC, so psycopg returns ``timezone.utc`` itself, and setting it
    leaves no transaction open on the fresh connection."""
    engine = create_engine(pg_url, utc=True)
    try:
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "UTC"
            assert conn.execute(text("SELECT now()")).scalar_one().tzinfo is dt.timezone.utc
    finally:
        engine.dispose()


def test_a_relay_puts_only_its_own_engine_in_utc(pg_url: URL) -> None:
    """A relay given a URL owns its engine and runs it in UTC; an application's engine handed
    to a relay keeps its own session zone."""
    relay = outbox.Relay(pg_url, lambda message: None)
    try:
        with relay.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "UTC"
    finally:
        relay.close()
    app = create_engine(pg_url, connect_args={"options": "-c TimeZone=Europe/Berlin"})
    try:
        outbox.metadata.create_all(app)
        outbox.Relay(app, lambda message: None).tick()
        with app.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "Europe/Berlin"
    finally:
        app.dispose()


def test_utc_sessions_are_a_no_op_on_sqlite(sqlite_engine: Engine) -> None:
    """SQLite has no session zone; the engine is returned untouched and still works."""
    assert use_utc_sessions(sqlite_engine) is sqlite_engine
    with sqlite_engine.connect() as conn:
        assert conn.execute(outbox.queries.pending_stmt()).scalar_one() == 0


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://app:hunter2@db/shop", "postgresql+psycopg://app:***@db/shop"),
        ("postgresql+psycopg://app:hun@ter2@db/shop", "postgresql+psycopg://app:***@db/shop"),
        (
            "postgresql+psycopg://app:hunter2@db:abc/shop",
            "postgresql+psycopg://app:***@db:abc/shop",
        ),
        ("postgresql://app:hun@ter2@db:abc/shop", "postgresql://app:***@db:abc/shop"),
        ("postgresql://app@db:abc/shop", "postgresql://app@db:abc/shop"),
        (
            "postgresql+psycopg://app@db/shop?password=hunter2&sslmode=require",
            "postgresql+psycopg://app@db/shop?password=***&sslmode=require",
        ),
        ("app:hunter2@db/shop", "<unparseable database URL>"),
        ("garbage", "garbage"),
        ("sqlite:///path/to/app.db", "sqlite:///path/to/app.db"),
        (
            URL.create("postgresql+psycopg", "app", "hunter2", "db"),
            "postgresql+psycopg://app:***@db",
        ),
    ],
)
def test_hide_password_never_shows_it(url: str | URL, shown: str) -> None:
    """Errors and logs show a database URL with the password replaced by ``***``, including a
    password with an unescaped '@' (SQLAlchemy would show its tail as the host), one in the
    query string, and one in a URL SQLAlchemy cannot parse; the rest stays readable."""
    assert hide_password(url) == shown
