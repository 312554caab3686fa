"""Wake on commit: the PostgreSQL trigger + LISTEN, and the in-process wake-up.

Relays here poll only once a minute, so a message published within the test's bound was
delivered by a wake-up, not by the polling sweep.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import alembic_ext  # noqa: F401 - registers the ops
import sqla_outbox as outbox
from sqla_outbox.message import OutboxMessage
from sqla_outbox.notify import CHANNEL

WAIT = 30.0
SLOW_POLL = 60.0


def libpq_dsn(url: URL) -> str:
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class Waiter:
    """A publisher that sets an event once it has seen ``count`` messages."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.seen: list[uuid.UUID] = []
        self.done = threading.Event()

    def publish(self, message: OutboxMessage) -> None:
        self.seen.append(message.id)
        if len(self.seen) >= self.count:
            self.done.set()


@pytest.fixture
def listening(pg_engine: Engine) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(libpq_dsn(pg_engine.url), autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def test_trigger_notifies_once_per_committed_transaction(
    pg_engine: Engine, listening: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A commit of 100 staged rows notifies once; a rolled-back enqueue notifies nobody."""
    with Session(pg_engine) as session:
        outbox.enqueue(session, "rolled-back")
        session.flush()
        session.rollback()
        for n in range(100):
            outbox.enqueue(session, "committed", {"n": n})
        session.commit()
    notes = list(listening.notifies(timeout=1.0))
    assert [n.channel for n in notes] == [CHANNEL]


def test_a_listening_relay_publishes_on_commit_from_elsewhere(pg_engine: Engine) -> None:
    """A row committed by another connection (not this process's sessions) wakes the relay."""
    waiter = Waiter(1)
    relay = outbox.Relay(pg_engine, waiter, poll_interval=SLOW_POLL)
    relay.start()
    try:
        with psycopg.connect(libpq_dsn(pg_engine.url)) as conn:
            conn.execute(
                "INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, "
                "run_at, staged_at) VALUES (%s, 'raw', 'default', '{}', 'k', 3, now(), now())",
                (uuid.uuid4(),),
            )
        assert waiter.done.wait(WAIT)
    finally:
        relay.stop()


def test_poll_only_relay_does_not_listen(pg_engine: Engine) -> None:
    """poll_only=True (for PgBouncer transaction pooling) opens no LISTEN connection."""
    relay = outbox.Relay(pg_engine, print, poll_only=True, poll_interval=SLOW_POLL)
    relay.start()
    try:
        with pg_engine.connect() as conn:
            listeners = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            ).scalar_one()
    finally:
        relay.stop()
    assert relay.poll_only and listeners == 0


def test_in_process_commit_wakes_a_local_relay(engine: Engine) -> None:
    """On any database, a session commit wakes the relays of this process at once."""
    waiter = Waiter(3)
    relay = outbox.Relay(engine, waiter, poll_interval=SLOW_POLL, poll_only=True)
    relay.start()
    try:
        with Session(engine) as session:
            for n in range(3):
                outbox.enqueue(session, "local", {"n": n})
            session.commit()
        assert waiter.done.wait(WAIT)
    finally:
        relay.stop()


def test_create_and_drop_op_manage_trigger_and_function(pg_url: URL) -> None:
    """op.create_outbox_table() adds the trigger; op.drop_outbox_table() drops its function."""
    engine = outbox.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            Operations(MigrationContext.configure(conn)).create_outbox_table()
            triggers = conn.execute(
                text("SELECT tgname FROM pg_trigger WHERE tgrelid = 'outbox'::regclass")
            ).scalars()
            assert list(triggers) == ["outbox_notify"]
            fillfactor = conn.execute(
                text("SELECT reloptions FROM pg_class WHERE relname = 'outbox'")
            ).scalar_one()
            assert fillfactor == ["fillfactor=50"]
        with engine.begin() as conn:
            Operations(MigrationContext.configure(conn)).drop_outbox_table()
            functions = conn.execute(
                text("SELECT count(*) FROM pg_proc WHERE proname = 'outbox_notify'")
            ).scalar_one()
            assert functions == 0
    finally:
        engine.dispose()
