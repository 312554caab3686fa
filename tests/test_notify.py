"""Wake on commit: the PostgreSQL trigger + LISTEN, and the in-process wake-up.

Relays here poll only once a minute, so a message published within the test's bound was
delivered by a wake-up, not by the polling sweep.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool
from support import run_cli, url_of, wait_until

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


def listen_rows(engine: Engine) -> list[tuple[int, str]]:
    """``(pid, application_name)`` of each session of this database that sits in LISTEN."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
        )
        return [(pid, name) for pid, name in rows]


def test_the_listen_connection_is_made_by_the_engine_and_holds_no_pool_slot(
    pg_url: URL, pg_engine: Engine
) -> None:
    """The LISTEN connection comes from the relay's engine: its connect_args (application_name)
    and do_connect hook apply. It leaves the pool at once: while listening the pool has every
    slot but the relay's own, and after stop() nothing is checked out or overflowing."""
    engine = outbox.create_engine(
        pg_url,
        connect_args={"application_name": "outbox-ear"},
        pool_size=1,
        max_overflow=1,
        pool_timeout=WAIT,  # a leaked slot makes a checkout below fail after this, not hang
    )
    seen: list[dict[str, object]] = []

    @event.listens_for(engine, "do_connect")
    def hook(_dialect: object, _record: object, _cargs: object, cparams: dict[str, Any]) -> None:
        seen.append(dict(cparams))
        cparams["application_name"] += "+hooked"

    pool = engine.pool
    assert isinstance(pool, QueuePool)
    relay = outbox.Relay(engine, Waiter(1), poll_interval=SLOW_POLL)
    try:
        relay.start()
        try:
            wait_until(relay.is_alive, "the relay to reach the database")
            wait_until(lambda: bool(listen_rows(pg_engine)), "the LISTEN connection")
            assert [name for _, name in listen_rows(pg_engine)] == ["outbox-ear+hooked"]
            assert seen and all(c["application_name"] == "outbox-ear" for c in seen)
            # The relay holds one connection between passes; the listener none.
            assert pool.checkedout() == 1
            with engine.connect() as conn:  # the second (overflow) slot is free
                conn.execute(text("SELECT 1"))
        finally:
            relay.stop()
        # stop() has closed the connection; its server process exits a moment later.
        wait_until(lambda: not listen_rows(pg_engine), "the LISTEN session to end")
        assert pool.checkedout() == 0 and pool.overflow() <= 0
        with engine.connect() as first, engine.connect() as second:  # both slots are free
            first.execute(text("SELECT 1"))
            second.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def test_the_listen_connection_uses_the_engines_creator(pg_url: URL, pg_engine: Engine) -> None:
    """An engine built with creator= (e.g. to fetch a token per connection) makes the LISTEN
    connection through that function too."""
    made: list[object] = []

    def creator() -> psycopg.Connection[Any]:
        made.append(None)
        return psycopg.connect(libpq_dsn(pg_url), application_name="outbox-creator")

    engine = outbox.create_engine("postgresql+psycopg://", creator=creator)
    relay = outbox.Relay(engine, Waiter(1), poll_interval=SLOW_POLL)
    relay.start()
    try:
        wait_until(lambda: bool(listen_rows(pg_engine)), "the LISTEN connection")
        assert [name for _, name in listen_rows(pg_engine)] == ["outbox-creator"]
        assert made
    finally:
        relay.stop()
        engine.dispose()


def test_reconnect_backoff_resets_after_a_healthy_period(
    pg_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Each drop of the LISTEN connection doubles the wait before reconnecting (0.25, 0.5, 1,
    2 s); a connection that then stays up for the healthy period resets it, so the next drop is
    retried after 0.25 s again, not 4 s (nor, later, 30 s). With polling at a minute, only the
    reconnected LISTEN can wake the relay for a commit made after that last kill."""
    waiter = Waiter(1)
    relay = outbox.Relay(pg_engine, waiter, poll_interval=SLOW_POLL)
    listener = relay._listener
    assert listener is not None
    listener.healthy_period = 1.0  # the quick kills below come within milliseconds of a connect
    killed: list[int] = []

    def next_listen_pid() -> int:
        found: list[int] = []

        def fresh() -> bool:
            found[:] = [pid for pid, _ in listen_rows(pg_engine) if pid not in killed]
            return bool(found)

        wait_until(fresh, "the listener to (re)connect")
        return found[0]

    def kill(pid: int) -> None:
        with pg_engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        killed.append(pid)

    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        relay.start()
        try:
            for _ in range(4):
                kill(next_listen_pid())
            pid = next_listen_pid()
            assert listener.healthy.wait(WAIT)  # up for the healthy period: backoff reset
            kill(pid)
            with psycopg.connect(libpq_dsn(pg_engine.url)) as conn:  # not this process's session
                conn.execute(
                    "INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, "
                    "run_at, staged_at) VALUES (%s, 'raw', 'default', '{}', 'k', 3, now(), now())",
                    (uuid.uuid4(),),
                )
            # Without the reset the listener would sleep 4 s before reconnecting.
            wait_until(waiter.done.is_set, "the wake-up after the last kill", timeout=2.0)
        finally:
            relay.stop()
    delays = [
        r.outbox_fields["retry_in"]  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "outbox_event", None) == "relay.listen_error"
    ]
    assert delays == [0.25, 0.5, 1.0, 2.0, 0.25]


class RefusingUntilRetried(Waiter):
    """Refuses ``refused`` until ``accept`` is set; counts what it published like a Waiter."""

    def __init__(self, count: int, refused: uuid.UUID) -> None:
        super().__init__(count)
        self.refused = refused
        self.accept = threading.Event()

    def publish(self, message: OutboxMessage) -> None:
        if message.id == self.refused and not self.accept.is_set():
            raise RuntimeError("refused until retried")
        super().publish(message)


@pytest.mark.parametrize("action", ["retry", "discard"])
def test_settling_a_dead_letter_from_elsewhere_wakes_a_listening_relay(
    pg_engine: Engine, action: str
) -> None:
    """`sqla-outbox dead retry|discard`, run in another process, notifies in its transaction: a
    relay that listens (and polls once a minute) publishes what it freed within a second."""
    with Session(pg_engine) as session:
        dead = outbox.enqueue(session, "first", ordering_key="k")
        behind = outbox.enqueue(session, "second", ordering_key="k")
        session.commit()
    publisher = RefusingUntilRetried(1 if action == "discard" else 2, dead.id)
    relay = outbox.Relay(pg_engine, publisher, poll_interval=SLOW_POLL, max_publish_attempts=1)
    relay.start()
    try:
        wait_until(lambda: bool(outbox.dead_letters(pg_engine)), "the dead letter")
        wait_until(lambda: not relay._wake.is_set(), "the relay idle")
        publisher.accept.set()
        done = run_cli("dead", action, "--all", url=url_of(pg_engine))
        assert done.returncode == 0, done.stderr
        assert publisher.done.wait(1.0), f"nothing published within 1 s of `dead {action}`"
        assert publisher.seen[-1] == behind.id
    finally:
        relay.stop()
