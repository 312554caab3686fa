"""``sqla_outbox.engines``: the engine fixes the outbox applies to engines it owns."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine, event, text
from sqlalchemy.orm import Session

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


def test_a_relay_claims_in_utc_and_gives_back_the_sessions_it_found(pg_url: URL) -> None:
    """On an application's engine whose sessions are set up on connect (a zone, ``jit``), the
    relay claims in UTC (psycopg then returns ``timezone.utc`` itself, nothing to convert per
    row) and the pool gets every connection back with the application's own settings, not the
    server's defaults."""
    app = create_engine(pg_url)

    @event.listens_for(app, "connect")
    def _app_session(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("SET TIME ZONE 'Europe/Berlin'")
        dbapi_connection.execute("SET jit = off")
        dbapi_connection.commit()

    staged: list[dt.datetime] = []
    try:
        outbox.metadata.create_all(app)
        with Session(app) as session:
            outbox.enqueue(session, "send_receipt", {"order_id": 1})
            session.commit()
        zones: list[str | None] = []

        @event.listens_for(app, "before_cursor_execute")
        def _zone_of_relay_steps(conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
            if "claimed_by" in statement:  # the claims and the marks
                zones.append(cursor.connection.info.parameter_status("TimeZone"))

        relay = outbox.Relay(app, lambda message: staged.append(message.staged_at))
        relay.drain()
        relay.close()
        assert zones and set(zones) == {"UTC"}
        assert [moment.tzinfo for moment in staged] == [dt.timezone.utc]
        pooled = [app.connect() for _ in range(app.pool.checkedin())]  # type: ignore[attr-defined]
        try:
            for conn in pooled:
                assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "Europe/Berlin"
                assert conn.exec_driver_sql("SHOW jit").scalar() == "off"
        finally:
            for conn in pooled:
                conn.close()
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
